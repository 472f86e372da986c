package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logWriter adapts memberlist's *log.Logger output ("[LEVEL] memberlist:
// message", one line per Write) to slog. It also spots the one line that
// reports this node's own failed probe, the only race-free sign of suspicion
// memberlist gives (see Member.State).
type logWriter struct {
	log       *slog.Logger
	onSuspect func(name string) // may be nil
}

// suspectPrefix and suspectSuffix frame memberlist's log line for a probe
// that got no direct nor indirect ack (memberlist state.go, probeNode):
// "[INFO] memberlist: Suspect %s has failed, no acks received". A test
// (TestSuspectIsReportedAndCleared) fails if an upgrade rewords it.
const (
	suspectPrefix = "Suspect "
	suspectSuffix = " has failed, no acks received"
)

func (w *logWriter) Write(p []byte) (int, error) {
	level, msg := parseMemberlistLine(string(bytes.TrimRight(p, "\r\n")))
	if w.onSuspect != nil && strings.HasPrefix(msg, suspectPrefix) && strings.HasSuffix(msg, suspectSuffix) {
		if name := msg[len(suspectPrefix) : len(msg)-len(suspectSuffix)]; name != "" {
			w.onSuspect(name)
		}
	}
	if strings.HasPrefix(msg, "ignoring alive message for") || strings.HasPrefix(msg, "Conflicting address for") {
		// The delegate logs these (NotifyAlive's caller, NotifyConflict)
		// with what they mean; a refused impostor repeats them.
		level = slog.LevelDebug
	}
	if w.log.Enabled(context.Background(), level) {
		w.log.Log(context.Background(), level, msg, "component", "memberlist")
	}
	return len(p), nil
}

// parseMemberlistLine splits "[LEVEL] memberlist: message" into a slog level
// and the message. Lines without a recognised level (memberlist has a few)
// are logged at Info.
func parseMemberlistLine(line string) (slog.Level, string) {
	level := slog.LevelInfo
	if strings.HasPrefix(line, "[") {
		if end := strings.IndexByte(line, ']'); end > 0 {
			switch line[1:end] {
			case "TRACE", "DEBUG":
				level = slog.LevelDebug
			case "INFO":
				level = slog.LevelInfo
			case "WARN", "WARNING":
				level = slog.LevelWarn
			case "ERR", "ERROR":
				level = slog.LevelError
			}
			line = strings.TrimLeft(line[end+1:], " ")
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	return level, line
}

// rateLimiter lets one event through per interval and counts the rest, so
// that a hostile or broken peer cannot flood the log with decode errors.
type rateLimiter struct {
	interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether to log now, and how many events were suppressed
// since the last one allowed.
func (l *rateLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}
