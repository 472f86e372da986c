package manifest

import (
	"fmt"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// ReadKustomization builds the kustomization in dir (its
// kustomization.yaml: resources, patches, namePrefix, labels, and the
// configMapGenerator and secretGenerator with their hash suffixes, the
// names that refer to them rewritten) with kustomize's own library
// (sigs.k8s.io/kustomize/api, as kubectl -k), then parses the objects as
// Parse does. Errors name dir.
func ReadKustomization(dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("-k %s: %w", dir, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("-k %s: %w", dir, err)
	}
	return Parse(y, dir+" (kustomization)")
}
