package clock

import (
	"testing"
	"time"
)

func TestATimerDoesNotCountFrozenTime(t *testing.T) {
	fired := make(chan time.Time, 1)
	began := time.Now()
	AfterFunc(150*time.Millisecond, func() { fired <- time.Now() })
	time.Sleep(50 * time.Millisecond)
	Freeze()
	if !Frozen() {
		t.Fatal("not frozen after Freeze")
	}
	select {
	case <-fired:
		t.Fatal("fired while frozen")
	case <-time.After(300 * time.Millisecond):
	}
	Thaw()
	at := <-fired
	// 50 ms before the freeze, 300 frozen, then the 100 it had left.
	if elapsed := at.Sub(began); elapsed < 440*time.Millisecond {
		t.Fatalf("fired after %s: frozen time was counted", elapsed)
	}
}

func TestATimerMadeWhileFrozenWaitsForTheThaw(t *testing.T) {
	Freeze()
	fired := make(chan struct{})
	AfterFunc(time.Millisecond, func() { close(fired) })
	select {
	case <-fired:
		t.Fatal("fired while frozen")
	case <-time.After(50 * time.Millisecond):
	}
	Thaw()
	select {
	case <-fired:
	case <-time.After(2 * time.Second):
		t.Fatal("did not fire after the thaw")
	}
}

func TestStopAcrossAFreeze(t *testing.T) {
	fired := make(chan struct{}, 1)
	timer := AfterFunc(20*time.Millisecond, func() { fired <- struct{}{} })
	Freeze()
	if !timer.Stop() {
		t.Fatal("Stop of a frozen timer said it had fired")
	}
	Thaw()
	select {
	case <-fired:
		t.Fatal("a stopped timer fired")
	case <-time.After(100 * time.Millisecond):
	}
	if timer.Stop() {
		t.Fatal("a second Stop said it stopped it")
	}
}

func TestFreezeAndThawTwiceAreOnce(t *testing.T) {
	fired := make(chan struct{})
	AfterFunc(30*time.Millisecond, func() { close(fired) })
	Freeze()
	Freeze()
	Thaw()
	Thaw()
	select {
	case <-fired:
	case <-time.After(2 * time.Second):
		t.Fatal("did not fire")
	}
}
