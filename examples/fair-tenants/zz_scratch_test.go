package main

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

func TestScratchThreeClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.WithSweepInterval(0))
		defer st.Close()
		s, _ := shaper.New(st, shaper.PerSecond(10), shaper.WithMaxQueue(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		n := map[string]int{}
		var order []string
		var wg sync.WaitGroup
		for _, f := range []shaper.Flow{{Name: "I", Priority: shaper.Interactive}, {Name: "N"}, {Name: "B", Priority: shaper.Batch}} {
			fctx := shaper.WithFlow(ctx, f)
			for range 200 {
				wg.Go(func() {
					if s.Wait(fctx, "k", 1) == nil {
						mu.Lock()
						n[f.Name]++
						order = append(order, f.Name)
						mu.Unlock()
					}
				})
			}
		}
		time.Sleep(10 * time.Second)
		cancel()
		wg.Wait()
		t.Logf("%v\n%v", n, order)
	})
}

// Interactive arrives when the Batch's turn is due.
func TestScratchInteractiveAtBatchTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.WithSweepInterval(0))
		defer st.Close()
		s, _ := shaper.New(st, shaper.PerSecond(10), shaper.WithMaxQueue(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		start := time.Now()
		add := func(f shaper.Flow, k int, at time.Duration) {
			wg.Go(func() {
				time.Sleep(at)
				fctx := shaper.WithFlow(ctx, f)
				var in sync.WaitGroup
				for range k {
					in.Go(func() {
						sub := time.Now()
						if s.Wait(fctx, "k", 1) == nil {
							mu.Lock()
							order = append(order, f.Name+"@"+time.Since(start).String()+"(w"+time.Since(sub).String()+")")
							mu.Unlock()
						}
					})
				}
				in.Wait()
			})
		}
		add(shaper.Flow{Name: "B", Priority: shaper.Batch}, 100, 0)
		add(shaper.Flow{Name: "N"}, 100, 0)
		for i := range 10 {
			add(shaper.Flow{Name: "I", Priority: shaper.Interactive}, 1, time.Duration(i)*100*time.Millisecond+time.Second+10*time.Millisecond)
		}
		time.Sleep(3 * time.Second)
		cancel()
		wg.Wait()
		for _, o := range order {
			t.Log(o)
		}
	})
}
