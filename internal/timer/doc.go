// Package timer is ThrottleKit's clock seam and its sleep-to-a-deadline.
//
// Everything in ThrottleKit that reads the time or sleeps does so through a
// [Clock]: [Real] in production, [Fake] in tests. The fake clock is fully
// deterministic: time moves only when a test calls [Fake.Advance] (wall clock
// and timers together) or [Fake.Jump] (the wall clock alone, which is what a
// host suspend, a VM pause or an NTP step looks like to a process).
//
// [SleepUntil] sleeps to an absolute wall-clock deadline in chunks of at most
// [MaxChunk], re-reading the wall clock after each chunk. Go timers run on the
// monotonic clock, which stops while a host is suspended; a single long timer
// would therefore oversleep by the whole suspension. Chunking bounds that error
// to one chunk, so a deadline days away (a monthly quota) is met to within a
// minute even across a suspend, and a wall-clock step is corrected at the next
// chunk. Cancellation of the context returns ctx.Err() at once.
//
// [SleepUntilPrecise] trades CPU for accuracy: it sleeps on a timer until a
// short window before the deadline, then yields the processor in a loop until
// the deadline passes. Use it for rates above about 500 per second from a
// single sequential caller, where the Go timer's wake-up latency (around a
// millisecond on a typical Linux host) would otherwise dominate the interval;
// the benchmarks in this package report its lateness and CPU cost.
package timer
