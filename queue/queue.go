package queue

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
	"golang.org/x/sync/semaphore"
)

var (
	// ErrClosed is returned by Submit and Do after Close has begun, and
	// reported for jobs that Close could not run before its ctx ended.
	ErrClosed = errors.New("throttlekit: queue closed")
	// ErrFull is matched by the error Submit returns when WithMaxPending jobs
	// are already waiting. (A wait beyond the shaper's MaxQueue is a
	// *shaper.QueueFullError, which matches shaper.ErrQueueFull.)
	ErrFull = errors.New("throttlekit: queue has too many pending jobs")
)

// Job is one unit of paced work: Run is called at the job's departure time on
// Key, having reserved Cost units (0 means 1).
type Job struct {
	Key  string
	Cost int64
	Run  func(ctx context.Context) error
}

// PanicError reports a job that panicked, or that called runtime.Goexit
// (Goexit is then true and Value is nil). The queue recovers and lives on.
type PanicError struct {
	Value  any
	Goexit bool
	Stack  []byte
}

// Error describes the panic.
func (e *PanicError) Error() string {
	if e.Goexit {
		return "throttlekit: job called runtime.Goexit"
	}
	return fmt.Sprintf("throttlekit: job panicked: %v", e.Value)
}

// CloseError is what Close returns when its ctx ended before the queue had
// drained. It matches the ctx's error (errors.Is(err,
// context.DeadlineExceeded)).
type CloseError struct {
	// Withdrawn is how many accepted jobs had not started: their slots were
	// given back and their submitters told ErrClosed.
	Withdrawn int
	// Running is how many jobs were still running when Close returned. Their
	// ctx is cancelled (its cause is ErrClosed); each reports its own result
	// when it returns. A job still waiting for its in-flight permit (see
	// Submit) counts as running: it stops waiting and reports ErrClosed.
	Running int
	Err     error // the ctx's error
}

// Error says what Close left behind.
func (e *CloseError) Error() string {
	return fmt.Sprintf("throttlekit: queue closed before draining (%v): %d jobs withdrawn, %d still running with their ctx cancelled", e.Err, e.Withdrawn, e.Running)
}

// Unwrap returns the ctx's error.
func (e *CloseError) Unwrap() error { return e.Err }

// Queue runs jobs at their departure times under a concurrency cap. Create it
// with New; it is safe for concurrent use.
type Queue struct {
	r          shaper.Reserver
	sem        *semaphore.Weighted
	workers    int64
	maxPending int
	onError    func(Job, error)

	mu       sync.Mutex
	pending  jobHeap
	reserved int            // Submits past the WithMaxPending check, not yet in pending
	awaiting int            // jobs of a flow waiting for its turn (await), not yet in pending
	awaits   sync.WaitGroup // the goroutines of those jobs, until they have reported or queued theirs
	seq      uint64
	closing  bool
	wake     chan struct{}   // nudges the dispatcher
	stop     context.Context // done when the dispatcher must give up
	giveUp   context.CancelFunc
	done     chan struct{} // closed when the dispatcher has exited
	running  sync.WaitGroup
	nrun     atomic.Int64 // jobs running now
	dropped  atomic.Int64 // jobs due when Close gave up, with every worker busy
}

// Option configures New.
type Option func(*Queue)

// WithWorkers caps how many jobs run at once (default 10).
func WithWorkers(n int) Option { return func(q *Queue) { q.workers = int64(max(n, 1)) } }

// WithMaxPending caps how many jobs may wait for their departure (default 0:
// no cap other than the shaper's MaxQueue).
func WithMaxPending(n int) Option { return func(q *Queue) { q.maxPending = max(n, 0) } }

// WithErrorHandler receives the error of every job submitted with Submit that
// fails, panics (*PanicError), is cancelled before it runs (its ctx's error),
// cannot run before Close gives up (ErrClosed), or is refused by the
// shaper after Submit accepted it (a job that acquires a permit, or waits
// for its flow's turn: a *shaper.QueueFullError, a *shaper.DeadlineError).
// The default discards them. It is called from the queue's goroutines.
func WithErrorHandler(f func(Job, error)) Option { return func(q *Queue) { q.onError = f } }

// New returns a queue pacing its jobs on r, and starts its dispatcher; Close
// stops it.
func New(r shaper.Reserver, opts ...Option) *Queue {
	q := &Queue{r: r, workers: 10, onError: func(Job, error) {}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	q.stop, q.giveUp = context.WithCancel(context.Background())
	for _, o := range opts {
		o(q)
	}
	q.sem = semaphore.NewWeighted(q.workers)
	go q.dispatch()
	return q
}

// item is a job waiting for its departure.
type item struct {
	job    Job
	at     time.Time
	seq    uint64
	res    shaper.Reservation
	ctx    context.Context
	result chan error // Do's; nil for Submit
	permit bool       // it acquires a permit when it starts (see Submit): res is set then
	index  int
	stopCh func() bool // stops watching ctx
}

type jobHeap []*item

func (h jobHeap) Len() int { return len(h) }
func (h jobHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h jobHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *jobHeap) Push(x any)   { it := x.(*item); it.index = len(*h); *h = append(*h, it) }
func (h *jobHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h, it.index = old[:len(old)-1], -1
	return it
}

// Submit reserves the job's departure slot at once and queues it to run then.
// It returns an error at once, and nothing runs, when the slot would be
// further away than the shaper's MaxQueue (*shaper.QueueFullError), when
// WithMaxPending jobs are already waiting (ErrFull), or after Close
// (ErrClosed). If ctx ends before the job starts, its slot is given back, it
// never runs, and the error handler receives ctx.Err().
//
// A job whose key's reservations hold an in-flight permit (a shaper with a
// Dimension.InFlight, see shaper.PermitHolder) cannot be given its slot at
// once: when the permits are all held, when one frees is not known. Such a
// job is queued as due at once, behind the permit jobs queued before it
// (WithMaxPending and ErrClosed apply as to any job); the worker that
// starts it waits there for a permit and then the slot (shaper.Acquire,
// with the job's ctx), runs it, and releases the permit when it returns,
// panics or calls runtime.Goexit. The shaper's refusals then go to the
// error handler (Do returns them), a ctx that ends while it waits too; a
// Reserver that holds permits without an Acquire method fails Submit with
// a *shaper.ConfigError. A job waiting for a permit holds its worker, so
// with WithWorkers above the key's InFlight the other keys' due jobs may
// wait for a worker meanwhile: give such keys a queue of their own. Any
// other job's reservation, should it hold a permit, is released too when
// the job returns.
//
// A job whose ctx carries a flow (shaper.WithFlow) on a Reserver that
// takes turns (shaper.TurnTaker) is not given its slot at once either: it
// waits for its flow's turn among the jobs and requests waiting on its key
// (shaper.Shaper.AwaitTurn), holding no worker, and is then queued for the
// slot it was granted, so that a tenant's backlog does not hold up the
// jobs of another submitted after it. Submit refuses a bad flow at once
// (a *shaper.FlowError) and otherwise accepts the job; the shaper's
// refusals (a turn past the deadline or MaxQueue) then go to the error
// handler (Do returns them). Each such job holds a goroutine while it
// waits (WithMaxPending caps them). A permit job keeps the path above: it
// takes its turn once its worker holds the permit.
func (q *Queue) Submit(ctx context.Context, job Job) error {
	_, err := q.enqueue(ctx, job, nil)
	return err
}

// Do is Submit that waits for the job and returns its error (or the reason it
// did not run: for a job acquiring an in-flight permit, the shaper's
// refusal too).
func (q *Queue) Do(ctx context.Context, job Job) error {
	result := make(chan error, 1)
	if _, err := q.enqueue(ctx, job, result); err != nil {
		return err
	}
	return <-result
}

func (q *Queue) enqueue(ctx context.Context, job Job, result chan error) (*item, error) {
	if job.Cost == 0 {
		job.Cost = 1
	}
	if q.r == nil {
		return nil, &shaper.ConfigError{Algorithm: "queue", Field: "Reserver", Value: nil, Reason: "queue.New was given a nil Reserver"}
	}
	if job.Run == nil {
		return nil, &shaper.ConfigError{Algorithm: "queue", Field: "Job.Run", Value: nil, Reason: "must not be nil"}
	}
	permit := holdsPermits(q.r, job.Key)
	if permit {
		if _, ok := q.r.(shaper.Acquirer); !ok {
			return nil, errNoAcquire(q.r)
		}
	}
	q.mu.Lock()
	if q.closing {
		q.mu.Unlock()
		return nil, ErrClosed
	}
	// The cap counts the Submits still reserving, so that it holds however
	// many arrive at once.
	if q.maxPending > 0 && q.pending.Len()+q.reserved+q.awaiting >= q.maxPending {
		q.mu.Unlock()
		return nil, ErrFull
	}
	if permit { // due at once: its worker acquires (run)
		if err := ctx.Err(); err != nil { // as Reserve would refuse it
			q.mu.Unlock()
			return nil, err
		}
		it := &item{job: job, ctx: ctx, result: result, permit: true}
		q.push(it)
		q.mu.Unlock()
		q.nudge()
		return it, nil
	}
	if f, ok := shaper.FlowOf(ctx); ok {
		if t, ok := q.r.(shaper.TurnTaker); ok { // it waits for its flow's turn (await)
			if err := cmp.Or(ctx.Err(), f.Validate()); err != nil {
				q.mu.Unlock()
				return nil, err
			}
			q.awaiting++
			q.awaits.Add(1)
			it := &item{job: job, ctx: ctx, result: result}
			q.mu.Unlock()
			go q.await(t, it)
			return it, nil
		}
	}
	q.reserved++
	q.mu.Unlock()
	res, err := q.r.Reserve(ctx, job.Key, job.Cost)
	q.mu.Lock()
	q.reserved--
	if err != nil {
		q.mu.Unlock()
		return nil, err
	}
	it := &item{job: job, at: res.Time(), res: res, ctx: ctx, result: result}
	if q.closing { // Close began while we reserved
		q.mu.Unlock()
		giveBack(ctx, &res)
		return nil, ErrClosed
	}
	q.push(it)
	q.mu.Unlock()
	q.nudge()
	return it, nil
}

// await waits for the turn of the flow of it's ctx (shaper.AwaitTurn),
// holding no worker, then queues it for the slot it was granted. Close
// giving up ends the wait (ErrClosed).
func (q *Queue) await(t shaper.TurnTaker, it *item) {
	defer q.awaits.Done()
	ctx, cancel := context.WithCancelCause(it.ctx)
	defer cancel(nil)
	stop := context.AfterFunc(q.stop, func() { cancel(ErrClosed) })
	res, err := t.AwaitTurn(ctx, it.job.Key, it.job.Cost)
	stop()
	q.mu.Lock()
	q.awaiting--
	switch {
	case err != nil:
		switch {
		case it.ctx.Err() != nil: // as for a job whose ctx ends before it starts
			err = it.ctx.Err()
		case ctx.Err() != nil: // Close gave up before its turn came
			err = ErrClosed
		}
	case q.stop.Err() != nil: // Close gave up as it came: the dispatcher is gone
		err = ErrClosed
	default:
		it.at, it.res = res.Time(), res
		q.push(it)
	}
	q.mu.Unlock()
	if err != nil {
		giveBack(it.ctx, &res)
		q.report(it, err)
	}
	q.nudge()
}

// push queues it; the caller holds q.mu.
func (q *Queue) push(it *item) {
	q.seq++
	it.seq = q.seq
	heap.Push(&q.pending, it)
	it.stopCh = context.AfterFunc(it.ctx, func() { q.withdraw(it, it.ctx.Err()) })
}

// giveBack gives back res, which will not depart: its slot, if its time
// has not come, and its in-flight permit, if it holds one.
func giveBack(ctx context.Context, res *shaper.Reservation) {
	ctx = context.WithoutCancel(ctx)
	_ = res.Cancel(ctx)
	_ = res.Release(ctx)
}

// holdsPermits reports whether r's reservations of key hold an in-flight
// permit (see shaper.PermitHolder).
func holdsPermits(r shaper.Reserver, key string) bool {
	h, ok := r.(shaper.PermitHolder)
	return ok && h.HoldsPermits(key)
}

// errNoAcquire is the refusal of a Reserver that holds permits but cannot
// wait for one (it has no Acquire method): its Wait could not release.
func errNoAcquire(r shaper.Reserver) error {
	return &shaper.ConfigError{Algorithm: "queue", Field: "Reserver", Value: fmt.Sprintf("%T", r),
		Reason: "the Reserver holds in-flight permits but has no Acquire method to wait for one (see shaper.PermitHolder)"}
}

// withdraw removes a job that has not started, gives its slot back and
// reports err. It does nothing if the job has already left the heap.
func (q *Queue) withdraw(it *item, err error) {
	q.mu.Lock()
	if it.index < 0 {
		q.mu.Unlock()
		return
	}
	heap.Remove(&q.pending, it.index)
	q.mu.Unlock()
	giveBack(it.ctx, &it.res) // a job that acquires has nothing yet: nothing to give
	q.report(it, err)
	q.nudge()
}

func (q *Queue) report(it *item, err error) {
	if it.result != nil {
		it.result <- err
		return
	}
	if err != nil {
		q.onError(it.job, err)
	}
}

func (q *Queue) nudge() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// dispatch starts due jobs, earliest departure first, under the concurrency
// cap. A job waiting for a worker never holds up the timer of another key.
// It waits for a job's departure on the clock of the shaper that granted it
// (Reservation.Clock), so that a queue runs on a test's fake clock.
func (q *Queue) dispatch() {
	defer close(q.done)
	for {
		q.mu.Lock()
		if q.pending.Len() == 0 {
			closing := q.closing && q.awaiting == 0
			q.mu.Unlock()
			if closing {
				return
			}
			select {
			case <-q.wake:
			case <-q.stop.Done():
				return
			}
			continue
		}
		next := q.pending[0]
		clock := next.res.Clock()
		if wait := next.at.Sub(clock.Now()); wait > 0 {
			q.mu.Unlock()
			t := clock.NewTimer(wait)
			select {
			case <-t.C():
			case <-q.wake:
				t.Stop()
			case <-q.stop.Done():
				t.Stop()
				return
			}
			continue
		}
		heap.Pop(&q.pending)
		q.mu.Unlock()
		next.stopCh()                                    // it starts now: its ctx no longer withdraws it
		if err := q.sem.Acquire(q.stop, 1); err != nil { // Close gave up while every worker was busy
			giveBack(next.ctx, &next.res)
			q.dropped.Add(1)
			q.report(next, ErrClosed)
			continue
		}
		q.running.Add(1)
		q.nrun.Add(1)
		go q.run(next)
	}
}

// run runs one job with a ctx that Close cancels if it gives up waiting.
// A panic and a runtime.Goexit in the job are reported as a *PanicError;
// either way the worker is released and the submitter hears of it. A job
// that acquires (item.permit) first waits for its permit and slot; the
// reservation's permit, if any, is released when the job returns, before
// its result is reported.
func (q *Queue) run(it *item) {
	defer q.running.Done()
	defer q.sem.Release(1)
	defer q.nrun.Add(-1)
	ctx, cancel := context.WithCancelCause(it.ctx)
	defer cancel(nil)
	stop := context.AfterFunc(q.stop, func() { cancel(ErrClosed) })
	defer stop()
	if it.permit {
		res, err := q.r.(shaper.Acquirer).Acquire(ctx, it.job.Key, it.job.Cost)
		if err != nil { // it never runs
			switch {
			case it.ctx.Err() != nil: // as for a job whose ctx ends before it starts
				err = it.ctx.Err()
			case ctx.Err() != nil: // Close gave up before it had its permit
				err = ErrClosed
			}
			q.report(it, err)
			return
		}
		it.res = res
	}
	var err error
	returned := false
	defer func() {
		if !returned { // runtime.Goexit: only the deferred calls run
			err = &PanicError{Goexit: true, Stack: debug.Stack()}
		}
		_ = it.res.Release(context.WithoutCancel(it.ctx))
		q.report(it, err)
	}()
	func() {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		err = it.job.Run(ctx)
	}()
	returned = true
}

// Close stops intake and drains: every accepted job runs at its departure
// time, and Close returns nil once all have returned. If ctx ends first,
// Close returns at once with a *CloseError (which matches ctx's error): the
// jobs that have not started are withdrawn (their slots given back, ErrClosed
// reported to their submitters), and the running jobs' ctx is cancelled
// (cause ErrClosed); the error says how many were still running. Each of
// those reports its own result when it returns; a job that ignores its ctx
// keeps its goroutine until then. No job is dropped silently. Close may be
// called once.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	q.nudge()
	drained := make(chan struct{})
	go func() {
		<-q.done
		q.awaits.Wait() // done with the dispatcher, but for a report
		q.running.Wait()
		close(drained)
	}()
	select {
	case <-drained:
		q.giveUp()
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	awaiting := q.awaiting // each reports ErrClosed (await)
	q.giveUp()             // the dispatcher exits, and running jobs' ctx is cancelled
	q.mu.Unlock()
	<-q.done
	q.awaits.Wait() // their waits end with ErrClosed, reported
	q.mu.Lock()
	left := append([]*item(nil), q.pending...)
	q.mu.Unlock()
	for _, it := range left {
		q.withdraw(it, ErrClosed)
	}
	withdrawn := len(left) + int(q.dropped.Load()) + awaiting
	select {
	case <-drained:
		return &CloseError{Withdrawn: withdrawn, Err: ctx.Err()}
	default:
	}
	return &CloseError{Withdrawn: withdrawn, Running: int(q.nrun.Load()), Err: ctx.Err()}
}

// Pending returns how many jobs are waiting for their departure (those of
// a flow waiting for its turn too).
func (q *Queue) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending.Len() + q.awaiting
}

// Wrap paces an existing consumer loop (a Kafka, SQS or channel reader)
// without a pool: the returned handler waits for msg's slot on r, then calls
// h. It returns the shaper's refusal (a *shaper.QueueFullError, a
// *shaper.DeadlineError, ctx.Err()) without calling h.
//
// When r holds in-flight permits for msg's key (a shaper with a
// Dimension.InFlight, see shaper.PermitHolder), the handler waits for a
// permit and then the slot (shaper.Acquire), and releases the permit when
// h returns, or panics; a Reserver that holds permits without an Acquire
// method fails with a *shaper.ConfigError, and h is not called.
func Wrap[T any](r shaper.Reserver, key func(T) string, cost func(T) int64, h func(context.Context, T) error) func(context.Context, T) error {
	return func(ctx context.Context, msg T) error {
		c := int64(1)
		if cost != nil {
			c = cost(msg)
		}
		k := key(msg)
		if !holdsPermits(r, k) {
			if err := r.Wait(ctx, k, c); err != nil {
				return err
			}
			return h(ctx, msg)
		}
		a, ok := r.(shaper.Acquirer)
		if !ok {
			return errNoAcquire(r)
		}
		res, err := a.Acquire(ctx, k, c)
		if err != nil {
			return err
		}
		defer func() { _ = res.Release(context.WithoutCancel(ctx)) }()
		return h(ctx, msg)
	}
}
