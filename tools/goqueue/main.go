// goqueue - the in-process peer of wqbench's mpmc and drain workloads:
// a work queue with client-go's algorithm and data (a FIFO slice, a dirty
// set and a processing set of interface{} items under one sync.Mutex, a
// sync.Cond for getters;
// Add, Get, Done, ShutDown as client-go's util/workqueue describes
// them), written here, bare (no metrics). Producers and consumers are
// goroutines in one process, GOMAXPROCS = the CPUs, as a controller
// built on client-go runs them. It prints wqbench's JSON lines, so its
// figures sit beside libwq's processes in the same run.
//
// Usage: go run ./tools/goqueue [-reps 5] [-adds 1000000] [-keys 1000]
package main

import (
	"flag"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	fifo       []any
	dirty      map[any]struct{}
	processing map[any]struct{}
	shutdown   bool
}

func newQueue() *queue {
	q := &queue{dirty: map[any]struct{}{}, processing: map[any]struct{}{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add reports whether the key was coalesced into a dirty one.
func (q *queue) add(k any) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown {
		return false
	}
	if _, ok := q.dirty[k]; ok {
		return true
	}
	q.dirty[k] = struct{}{}
	if _, ok := q.processing[k]; ok {
		return false
	}
	q.fifo = append(q.fifo, k)
	q.cond.Signal()
	return false
}

func (q *queue) get(wait bool) (any, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.fifo) == 0 && !q.shutdown && wait {
		q.cond.Wait()
	}
	if len(q.fifo) == 0 {
		return nil, false
	}
	k := q.fifo[0]
	q.fifo[0] = nil
	q.fifo = q.fifo[1:]
	q.processing[k] = struct{}{}
	delete(q.dirty, k)
	return k, true
}

func (q *queue) done(k any) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, k)
	if _, ok := q.dirty[k]; ok {
		q.fifo = append(q.fifo, k)
		q.cond.Signal()
	}
}

func (q *queue) shutDown() {
	q.mu.Lock()
	q.shutdown = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

func key(i int) string { return fmt.Sprintf("k%011d", i) } // wqbench's 12-byte keys

// mpmc: p producers add `adds` keys drawn from `hot` keys; c consumers
// get and done until shutdown. Producer adds/s, the coalesced share and
// the keys processed per second of the producers' span (as wqbench's).
func mpmc(p, c, adds, hot int) (float64, float64, float64) {
	q := newQueue()
	keys := make([]string, hot)
	for i := range keys {
		keys[i] = key(i)
	}
	var wg sync.WaitGroup
	var processed int64
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(0)
			defer func() { atomic.AddInt64(&processed, n) }()
			for {
				k, ok := q.get(true)
				if !ok {
					return
				}
				n++
				q.done(k)
			}
		}()
	}
	var coalesced int64
	var pw sync.WaitGroup
	start := time.Now()
	for i := 0; i < p; i++ {
		pw.Add(1)
		go func(id int) {
			defer pw.Done()
			rng := uint64(0x9e3779b97f4a7c15) * uint64(id+1)
			n, co := adds/p, int64(0)
			for j := 0; j < n; j++ {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				if q.add(keys[(rng>>32)%uint64(hot)]) {
					co++
				}
			}
			atomic.AddInt64(&coalesced, co)
		}(i)
	}
	pw.Wait()
	el := time.Since(start).Seconds()
	q.shutDown()
	wg.Wait()
	return float64(adds/p*p) / el, float64(coalesced) / float64(adds/p*p),
		float64(processed) / el
}

// drain: n keys queued beforehand, c consumers get + done until empty.
func drain(c, n int) float64 {
	q := newQueue()
	for i := 0; i < n; i++ {
		q.add(key(i))
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, ok := q.get(false)
				if !ok {
					return
				}
				q.done(k)
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

func report(workload, variant, unit string, v []float64, extra string) {
	sort.Float64s(v)
	med := v[len(v)/2]
	fmt.Printf("{\"workload\":\"%s\",\"variant\":\"%s\",\"peer\":\"goqueue\",\"unit\":\"%s\","+
		"\"median\":%.0f,\"min\":%.0f,\"max\":%.0f,\"spread\":%.4f,\"reps\":%d%s}\n",
		workload, variant, unit, med, v[0], v[len(v)-1], (v[len(v)-1]-v[0])/med, len(v), extra)
}

func main() {
	reps := flag.Int("reps", 5, "repetitions per figure")
	adds := flag.Int("adds", 1000000, "adds per mpmc repetition")
	hot := flag.Int("keys", 1000, "hot keys of mpmc")
	flag.Parse()
	for _, pc := range [][2]int{{1, 1}, {1, 2}, {2, 1}, {2, 2}} {
		var v []float64
		var co float64
		var ps []float64
		for r := 0; r < *reps; r++ {
			x, c, s := mpmc(pc[0], pc[1], *adds, *hot)
			v = append(v, x)
			co += c
			ps = append(ps, s)
		}
		sort.Float64s(ps)
		report("mpmc", fmt.Sprintf("p%dc%d", pc[0], pc[1]), "adds/s", v,
			fmt.Sprintf(",\"coalesced\":%.3f,\"processed_per_s\":%.0f", co/float64(*reps),
				ps[len(ps)/2]))
	}
	for _, c := range []int{1, 2, 4} {
		var v []float64
		for r := 0; r < *reps; r++ {
			v = append(v, drain(c, *adds))
		}
		report("drain", fmt.Sprintf("C=%d", c), "keys/s", v, "")
	}
}
