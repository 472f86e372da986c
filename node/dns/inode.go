package dns

import (
	"os"
	"syscall"
)

// inode is the inode number of the file info describes (0 when unknown):
// a file renamed over the zone file is another version even when its
// time and size match.
func inode(info os.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
