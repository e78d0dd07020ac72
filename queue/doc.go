// Package queue runs paced work: a worker pool whose jobs each reserve a
// departure slot on a shaper.Reserver when submitted and run at that slot,
// with at most WithWorkers running at once.
//
//	q := queue.New(s, queue.WithWorkers(8), queue.WithErrorHandler(logIt))
//	err := q.Submit(ctx, queue.Job{Key: "tenant-7", Run: sync}) // QueueFullError = backpressure
//	...
//	err = q.Close(ctx) // stops intake, drains; at ctx's end cancels what runs (*CloseError)
//
// Jobs are started earliest departure first, so a slow or far-future key never
// holds up another key's due jobs, and the jobs of one key start in the order
// they were reserved. Submit is asynchronous (errors go to WithErrorHandler);
// Do waits for the job and returns its error. WithMaxPending caps the jobs
// waiting for their slot, however many Submit at once. A job that panics or
// calls runtime.Goexit is reported as a *PanicError and the pool lives on.
// Wrap paces an existing consumer loop without the pool.
//
// On a shaper with an in-flight dimension (shaper.Dimension.InFlight) a job
// also holds one of its key's permits while it runs, so that at most
// InFlight jobs of a key run at once, fleet-wide on a shared store. Submit
// cannot know such a job's slot, which waits for a permit: it queues the
// job as due, and the worker that starts it waits for its permit and slot
// (shaper.Shaper.Acquire), runs it and releases the permit when it returns,
// however it returns. Submit does not fail because every permit is held.
// Wrap acquires and releases the same way.
//
// A job submitted with a ctx carrying a flow (shaper.WithFlow: a tenant,
// its weight and priority class) waits for its flow's turn among the jobs
// and requests waiting on its key, without holding a worker
// (shaper.Shaper.AwaitTurn), and then runs at the slot it was granted: a
// tenant's backlog does not hold up the jobs another tenant submits after
// it.
package queue
