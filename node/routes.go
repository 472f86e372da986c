package node

// closed is a closed channel: "ready now".
func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
