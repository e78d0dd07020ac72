package gcra

import "math"

// Convert returns a key's TAT as kernel k reads it at now, when the TAT was
// stored under another contract, of interval sInt and tolerance sTau (a
// contract changed live: SetRate, or a process of the fleet that has not
// followed the change yet). sInt 0 means the TAT was stored with no
// contract recorded, and is read as it is.
//
// What carries over is the work still queued, never moved ahead of a slot
// already granted: the queue ahead of now, tat - now, is a number of units
// at sInt each, which cost k.Interval each now; and the instant before
// which no departure goes, tat - sTau (the last slot granted on a key that
// queued), stays put. The TAT is the later of the two readings. A TAT at or
// before now is a cold key under every contract (its Redis key expires
// then), and is read as it is.
func (k *Kernel) Convert(tat, now, sInt, sTau float64) float64 {
	if sInt == 0 || sInt == k.Interval && sTau == k.Tau || !(tat > now) {
		return tat
	}
	units := sumUp(now, 0, float64((tat-now)*float64(k.Interval/sInt))) // rounded up: never early
	kept := (tat - sTau) + k.Tau
	return math.Max(units, kept)
}
