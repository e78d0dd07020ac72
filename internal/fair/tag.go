package fair

// Tag is a virtual time held exactly as the unevaluated sum Hi + Lo of two
// float64 (a double-double, |Lo| <= ulp(Hi)/2, Lo never -0): about 106
// bits, so that a step of 1e-6 (cost 1 at MaxWeight) still counts at a
// virtual time of 1e22, where a float64 would drop it. Tags are never
// negative.
type Tag struct{ Hi, Lo float64 }

// Less reports a < b. Normalized pairs compare by Hi, then Lo.
func (a Tag) Less(b Tag) bool { return a.Hi < b.Hi || a.Hi == b.Hi && a.Lo < b.Lo }

// Max returns the greater of a and b (a on a tie).
func (a Tag) Max(b Tag) Tag {
	if a.Less(b) {
		return b
	}
	return a
}

// Add returns a + q for q >= 0, rounded once at about 106 bits: TwoSum of
// Hi and q, the error plus Lo, then TwoSum again to renormalize. Only
// additions and subtractions, in this order (lua/fair_turn.lua's tag_add
// is the same, operation for operation); + 0 turns a -0 into 0.
func (a Tag) Add(q float64) Tag {
	s := a.Hi + q
	sb := s - a.Hi
	e := (a.Hi - (s - sb)) + (q - sb)
	e = e + a.Lo
	hi := s + e
	hb := hi - s
	lo := (s - (hi - hb)) + (e - hb)
	return Tag{hi, lo + 0}
}

// Float is the tag rounded to a float64 (for estimates, not decisions).
func (a Tag) Float() float64 { return a.Hi + a.Lo }
