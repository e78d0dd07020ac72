package shaper_test

import "github.com/throttlekit/throttlekit-go/shaper"

func (m *mrun) featureOptions() []shaper.Option          { return nil }
func (m *mrun) featureDims() []shaper.Dimension          { return nil }
func (m *mrun) setup()                                   {}
func (m *mrun) collect()                                 {}
func (m *mrun) finish()                                  {}
func (m *mrun) stopPending()                             {}
func (m *mrun) holdsPermits(what string, err error) bool { return false }
