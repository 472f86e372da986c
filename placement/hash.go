package placement

import "math"

// The hash of (node, workload key, ordinal) is built from two string
// hashes, each computed once per Assign: FNV-1a (64-bit, IETF draft
// draft-eastlake-fnv) of the node name and of the workload key, each
// passed through the splitmix64 finalizer (Steele, Lea, Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014) because FNV-1a
// alone mixes its last bytes poorly. The per-(node, replica) hash is then
// mix(nodeHash ^ replicaHash): one xor and one finalizer in the hot loop,
// the construction dgryski/go-rendezvous uses.

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
	// golden is 2^64 / phi, splitmix64's increment; it spreads ordinals
	// over the whole 64-bit space before mixing.
	golden = 0x9e3779b97f4a7c15
)

// fnv1a returns the 64-bit FNV-1a hash of s.
func fnv1a(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// mix is the splitmix64 finalizer: a bijection on uint64 in which every
// input bit flips each output bit with probability close to 1/2.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// nodeHash is the per-node half of the rendezvous hash.
func nodeHash(name string) uint64 { return mix(fnv1a(name)) }

// replicaHash is the per-replica half of the rendezvous hash.
func replicaHash(key string, ordinal int) uint64 {
	return mix(fnv1a(key) + (uint64(ordinal)+1)*golden)
}

// pairHash is h(node, key, ordinal).
func pairHash(node, replica uint64) uint64 { return mix(node ^ replica) }

// score is the weighted rendezvous score w / -ln(u) of the logarithmic
// method (Schindelhauer and Schomaker, "Weighted distributed hash tables",
// SPAA 2005): with u uniform on (0,1), -ln(u)/w is exponential with rate w,
// so the node with the highest score (the smallest exponential) wins with
// probability w / sum(w), and removing a node only moves what it won.
//
// u takes the top 48 bits of h, offset by half a step so that it lies in
// (0,1) strictly. 48 rather than 53 bits keeps neighbouring values of u so
// far apart (2^-48) that ln, accurate to 1 ulp, cannot reorder them: score
// is then non-decreasing in h for a fixed weight, which Assign relies on
// to compare nodes of equal weight by h alone, with no logarithm.
func score(w float64, h uint64) float64 {
	u := (float64(h>>16) + 0.5) * 0x1p-48
	return w / -portableLog(u)
}

// portableLog returns ln(x) for finite x > 0, bit for bit the same on
// every GOARCH. math.Log is not: on amd64 and s390x it is assembly, and
// elsewhere the compiler may fuse x*y+z into one FMA instruction (the Go
// spec allows it; arm64 does it), so a mixed amd64/arm64 cluster could
// disagree in the last bit and, on a near tie, on an owner. Here every
// product is wrapped in an explicit float64 conversion, which the spec says
// prevents fusion, leaving only correctly rounded IEEE 754 operations.
//
// The algorithm and constants are FreeBSD's e_log.c (Sun Microsystems,
// 1993), as in Go's pure-Go math.log; error below 1 ulp.
func portableLog(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01 // 3fe62e42 fee00000
		ln2Lo = 1.90821492927058770002e-10 // 3dea39ef 35793c76
		l1    = 6.666666666666735130e-01   // 3FE55555 55555593
		l2    = 3.999999999940941908e-01   // 3FD99999 9997FA04
		l3    = 2.857142874366239149e-01   // 3FD24924 94229359
		l4    = 2.222219843214978396e-01   // 3FCC71C5 1D8E78AF
		l5    = 1.818357216161805012e-01   // 3FC74664 96CB03DE
		l6    = 1.531383769920937332e-01   // 3FC39A09 D078C69F
		l7    = 1.479819860511658591e-01   // 3FC2F112 DF3E5244
	)
	// x = f1 * 2^ki with f1 in [sqrt(2)/2, sqrt(2)); Frexp is exact.
	f1, ki := math.Frexp(x)
	if f1 < math.Sqrt2/2 {
		f1 *= 2
		ki--
	}
	f := f1 - 1
	k := float64(ki)
	s := f / (2 + f)
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := float64(s2 * (l1 + float64(s4*(l3+float64(s4*(l5+float64(s4*l7)))))))
	t2 := float64(s4 * (l2 + float64(s4*(l4+float64(s4*l6)))))
	r := t1 + t2
	hfsq := float64(float64(0.5*f) * f)
	return float64(k*ln2Hi) - ((hfsq - (float64(s*(hfsq+r)) + float64(k*ln2Lo))) - f)
}
