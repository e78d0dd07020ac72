package algorithms

// Hooks for the Lua conformance test (lua_conformance_test.go, package
// algorithms_test), which compares the scripts' raw figures with Go's bit
// for bit.

// Raw returns the figures d was made from, before rounding: the delay
// (admitted) or retry-after (refused) in ms, the remaining units, the reset
// in ms.
func (d Decision) Raw() (wait, remaining, reset float64) { return d.raw[0], d.raw[1], d.raw[2] }

// MakeDecision is makeDecision.
var MakeDecision = makeDecision
