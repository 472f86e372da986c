package manifest

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ValidationError is the error Parse, ReadPaths and Decode return when the
// input is not an acceptable manifest. It lists every problem found, grouped
// by document, so a user can fix a whole file in one pass. Use errors.As to
// tell it apart from I/O errors (ReadPaths joins those alongside it).
type ValidationError struct {
	Objects []ObjectError
}

// ObjectError holds the problems of one document (or one item of a
// `kind: List`).
type ObjectError struct {
	// Source names the input: a file path, "<stdin>", or "" for Decode.
	Source string
	// Document is the 1-based position of the document in Source, counting
	// only documents with content (comment-only preambles are not counted);
	// 0 for Decode.
	Document int
	// Line is the 1-based line of Source where the document starts; 0 if
	// unknown.
	Line int
	// Kind and Name identify the object once it was decoded far enough; they
	// are empty for documents that could not be decoded.
	Kind string
	Name string
	// Decoding lists problems that stopped or disturbed decoding: malformed
	// YAML or JSON, an unsupported apiVersion/kind, unknown or duplicate
	// fields (the message carries the field path), and type mismatches.
	Decoding []error
	// Errs lists validation problems of the defaulted object, worded as the
	// Kubernetes API server words them.
	Errs field.ErrorList
}

// Error returns one line per problem, each prefixed with where it was found,
// e.g. `hello.yaml: Deployment "hello": spec.replicas: Invalid value: -1: must
// be greater than or equal to 0`.
func (e *ValidationError) Error() string {
	var b strings.Builder
	for _, line := range e.Lines() {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	return b.String()
}

// Lines returns the problems one per element, formatted as in Error.
func (e *ValidationError) Lines() []string {
	var lines []string
	for i := range e.Objects {
		lines = append(lines, e.Objects[i].lines()...)
	}
	return lines
}

func (o *ObjectError) empty() bool {
	return len(o.Decoding) == 0 && len(o.Errs) == 0
}

// prefix says where a problem is: the object by kind and name when known
// (that is what users grep for), the document position otherwise.
func (o *ObjectError) prefix() string {
	var parts []string
	if o.Source != "" {
		parts = append(parts, o.Source)
	}
	if o.Kind == "" || o.Name == "" {
		if o.Document > 0 {
			doc := "document " + strconv.Itoa(o.Document)
			if o.Line > 0 {
				doc += fmt.Sprintf(" (line %d)", o.Line)
			}
			parts = append(parts, doc)
		}
	}
	switch {
	case o.Kind != "" && o.Name != "":
		parts = append(parts, fmt.Sprintf("%s %q", o.Kind, o.Name))
	case o.Kind != "":
		parts = append(parts, o.Kind)
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ": ") + ": "
}

func (o *ObjectError) lines() []string {
	p := o.prefix()
	lines := make([]string, 0, len(o.Decoding)+len(o.Errs))
	for _, err := range o.Decoding {
		lines = append(lines, p+err.Error())
	}
	for _, err := range o.Errs {
		lines = append(lines, p+err.Error())
	}
	return lines
}

// collect gathers per-document results into a *ValidationError, or nil when
// nothing is wrong.
func collect(objs []ObjectError) error {
	var bad []ObjectError
	for _, o := range objs {
		if !o.empty() {
			bad = append(bad, o)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return &ValidationError{Objects: bad}
}
