package shaper

import "github.com/throttlekit/throttlekit-go/internal/store"

// Store keeps shapers' per-key state: memstore.New for one process,
// redisstore.New for a fleet. One store serves many shapers, each under its
// own prefix. The contract a store implements is internal to this module:
// those two packages hold its only implementations.
type Store interface{ store.Provider }
