package shaper

// SetJitterForModel makes Wait's retry jitter draw from f (the model-based
// test, in package shaper_test, gives each run a seeded source so that a
// seed replays exactly) and returns the call that restores the default.
func SetJitterForModel(f func(n int64) int64) (restore func()) {
	old := jitterN
	jitterN = f
	return func() { jitterN = old }
}
