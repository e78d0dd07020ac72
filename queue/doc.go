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
package queue
