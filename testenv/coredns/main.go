// CoreDNS for the test node, from its Go module, with only the plugins testenv's Corefile uses: the
// stock main (github.com/coredns/coredns) links every plugin and its cloud SDKs, which costs minutes of
// compile time on two cores for nothing. coremain.Run is the stock entry point.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
