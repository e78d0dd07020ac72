package gcra

// Convert returns a key's TAT as kernel k reads it, when the TAT was stored
// under another contract, of interval sInt and tolerance sTau (a contract
// changed live: SetRate, or a process of the fleet that has not followed
// the change yet). sInt 0 means the TAT was stored with no contract
// recorded, and is read as it is.
//
// The instant the next unit could depart under the contract that stored
// it, tat + sInt - sTau, stays put: it is never before a slot granted on
// the key (on a key that queued it is one interval after the last), so no
// slot granted under k departs ahead of one granted before, and a larger
// burst builds up again at k's rate from there, never at once. A TAT at or
// before now is a cold key under every contract (its Redis key expires
// then), and is read as it is. Two contracts convert back and forth
// exactly (up to rounding), so shapers of a fleet that decide on one
// schedule under two contracts while a change propagates never inflate or
// shrink it between them.
func (k *Kernel) Convert(tat, now, sInt, sTau float64) float64 {
	if sInt == 0 || sInt == k.Interval && sTau == k.Tau || !(tat > now) {
		return tat
	}
	return (tat - (sTau - sInt)) + (k.Tau - k.Interval)
}
