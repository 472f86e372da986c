package node

import (
	"bufio"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// trimText asks the kernel to drop this process's mappings of its own
// executable's read-only pages (MADV_PAGEOUT): code and tables touched
// at start (package initialisation, flag parsing, set-up) and not since.
// Recent kernels map a binary's page cache in large folios (2 MiB), so a
// Go binary of ~45 MB is almost wholly resident after start; what the
// agent runs afterwards faults back in. The pages are clean and shared
// with the page cache, so this changes nothing the agent does, only the
// resident set it shows (README, Benchmarks). It reports the bytes it
// advised; errors (an older kernel without MADV_PAGEOUT) are logged at
// debug level and ignored.
func trimText(log *slog.Logger) int64 {
	exe, err := os.Executable()
	if err != nil {
		return 0
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fld := strings.Fields(sc.Text())
		if len(fld) < 6 || fld[5] != exe || strings.Contains(fld[1], "w") {
			continue
		}
		from, to, ok := strings.Cut(fld[0], "-")
		if !ok {
			continue
		}
		a, errA := strconv.ParseUint(from, 16, 64)
		b, errB := strconv.ParseUint(to, 16, 64)
		if errA != nil || errB != nil || b <= a {
			continue
		}
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(a), uintptr(b-a), unix.MADV_PAGEOUT); e != 0 {
			log.Debug("madvise pageout of the agent's text", "err", e)
			continue
		}
		total += int64(b - a)
	}
	return total
}
