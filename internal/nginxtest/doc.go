// Package nginxtest starts a real nginx for tests: a partner that enforces
// its rate limit with nginx's own limit_req module, which nobody here wrote
// or tuned. It never fakes nginx.
//
// Start writes a configuration into the test's temporary directory (every
// file nginx writes, pid, logs and temporary paths, lives there), starts
// nginx in the foreground as a single process on a free loopback port, and
// stops it when the test ends. Every request, whatever its method and path,
// goes through one limit_req zone: an accepted request gets 200 and a tiny
// body, a refused one 429 (limit_req_status 429), with a Retry-After
// header when Config.RetryAfter is set. Server.Log reads nginx's access log
// back as (arrival time, status) entries.
//
// If nginx is not installed the test fails and says how to install it
// (Debian: apt-get install nginx-light; .ci/run does this). It is looked
// up on PATH, then at /usr/sbin/nginx, where Debian puts it outside root's
// PATH.
package nginxtest
