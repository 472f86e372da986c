package gossip

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hashicorp/serf/coordinate"
)

// Vivaldi coordinates ride on memberlist's probe acks (memberlist.PingDelegate): each ack
// carries the responder's coordinate, and the prober feeds it with the
// measured RTT to its coordinate.Client, as serf does (serf ping_delegate.go).
//
// Ack payload, format 1 (90 bytes for serf's default 8 dimensions):
//
//	byte            format (1)
//	byte            dimensions n
//	n × float64     Vec (IEEE 754 bits, big-endian), seconds
//	float64         Error (dimensionless)
//	float64         Adjustment, seconds
//	float64         Height, seconds

// coordFormat is the format byte of the ack payload (format 1 above).
const coordFormat = 1

// maxCoordSeconds bounds every distance-like component a peer may send. Real
// coordinates stay within a few RTTs of the origin (serf's client rejects
// RTTs over 10 s); anything past this is garbage or hostile, and would only
// drag this node's own coordinate off.
const maxCoordSeconds = 1000.0

// maxCoordError bounds Error; serf's client caps its own at VivaldiErrorMax
// (1.5 by default).
const maxCoordError = 100.0

func encodeCoordinate(c *coordinate.Coordinate) []byte {
	b := make([]byte, 0, 2+8*(len(c.Vec)+3))
	b = append(b, coordFormat, byte(len(c.Vec)))
	for _, v := range c.Vec {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	for _, v := range []float64{c.Error, c.Adjustment, c.Height} {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// decodeCoordinate parses an ack payload into a coordinate of dims
// dimensions, rejecting other formats, other dimensionalities, non-finite
// components (coordinate.IsValid) and out-of-range values.
func decodeCoordinate(b []byte, dims int) (*coordinate.Coordinate, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: coordinate: %d bytes", errMalformed, len(b))
	}
	if b[0] != coordFormat {
		return nil, fmt.Errorf("%w: coordinate: unknown format %d", errMalformed, b[0])
	}
	if int(b[1]) != dims {
		return nil, fmt.Errorf("%w: coordinate: %d dimensions, want %d", errMalformed, b[1], dims)
	}
	if want := 2 + 8*(dims+3); len(b) != want {
		return nil, fmt.Errorf("%w: coordinate: %d bytes, want %d", errMalformed, len(b), want)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.BigEndian.Uint64(b[2+8*i:])) }
	c := &coordinate.Coordinate{Vec: make([]float64, dims)}
	for i := range c.Vec {
		c.Vec[i] = f(i)
	}
	c.Error, c.Adjustment, c.Height = f(dims), f(dims+1), f(dims+2)
	if !c.IsValid() {
		return nil, fmt.Errorf("%w: coordinate: NaN or infinite component", errMalformed)
	}
	for _, v := range c.Vec {
		if math.Abs(v) > maxCoordSeconds {
			return nil, fmt.Errorf("%w: coordinate: component %g out of range", errMalformed, v)
		}
	}
	switch {
	case !(c.Error > 0 && c.Error <= maxCoordError):
		return nil, fmt.Errorf("%w: coordinate: error %g out of range", errMalformed, c.Error)
	case math.Abs(c.Adjustment) > maxCoordSeconds:
		return nil, fmt.Errorf("%w: coordinate: adjustment %g out of range", errMalformed, c.Adjustment)
	case !(c.Height >= 0 && c.Height <= maxCoordSeconds):
		return nil, fmt.Errorf("%w: coordinate: height %g out of range", errMalformed, c.Height)
	}
	return c, nil
}
