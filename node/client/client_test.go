package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/starling-orchestrator/starling/node/api"
)

// serve answers every request on route with err (as the agent does) or,
// when err is nil, with v as JSON.
func serve(t *testing.T, route api.Route, err error, v any) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc(route.String(), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code, body := api.ErrorBody(err)
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(body)
			return
		}
		json.NewEncoder(w).Encode(v)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, cerr := New(srv.URL)
	if cerr != nil {
		t.Fatal(cerr)
	}
	return c
}

func TestErrorsComeBackTypedWithTheAgentsMessage(t *testing.T) {
	ctx := context.Background()
	notFound := api.Errorf(http.StatusNotFound, `deployment "web" not found in namespace "default"`)
	c := serve(t, api.RouteObject, notFound, nil)
	_, err := c.Get(ctx, "deployment", "default", "web")
	if !apierrors.IsNotFound(err) || err.Error() != `deployment "web" not found in namespace "default"` {
		t.Fatalf("not found: %T %v", err, err)
	}

	errs := field.ErrorList{field.Invalid(field.NewPath("spec", "replicas"), -1, "must be greater than or equal to 0"),
		field.Required(field.NewPath("spec", "selector"), "")}
	invalid := api.NewError(http.StatusUnprocessableEntity, errors.Join(errors.New("Deployment default/web"), errs.ToAggregate()))
	c = serve(t, api.RouteApply, invalid, nil)
	_, err = c.Apply(ctx, api.ApplyRequest{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("invalid: %T %v", err, err)
	}
	var se *apierrors.StatusError
	errors.As(err, &se)
	if d := se.ErrStatus.Details; d == nil || len(d.Causes) != 2 || d.Causes[0].Field != "spec.replicas" || d.Causes[1].Field != "spec.selector" {
		t.Fatalf("causes: %+v", se.ErrStatus.Details)
	}

	c = serve(t, api.RouteForgetNode, api.Errorf(http.StatusConflict, "node n2 is alive"), nil)
	if _, err := c.ForgetNode(ctx, "n2"); !apierrors.IsConflict(err) {
		t.Fatalf("conflict: %v", err)
	}
	c = serve(t, api.RouteNodes, api.Errorf(http.StatusUnauthorized, "missing or wrong bearer token"), nil)
	if _, err := c.Nodes(ctx); !apierrors.IsUnauthorized(err) {
		t.Fatalf("unauthorized: %v", err)
	}
	// Any other error is an internal error with its message.
	c = serve(t, api.RouteReplicas, errors.New("disk on fire"), nil)
	if _, err := c.Replicas(ctx); !apierrors.IsInternalError(err) || err.Error() != "disk on fire" {
		t.Fatalf("internal: %v", err)
	}
}

func TestOldAgentErrorsStillTyped(t *testing.T) {
	// An agent from before the Status body sent {"error": "..."} only.
	mux := http.NewServeMux()
	mux.HandleFunc(api.RouteObject.String(), func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"deployment \"x\" not found"}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, _ := New(srv.URL)
	_, err := c.Get(context.Background(), "deployment", "default", "x")
	if !apierrors.IsNotFound(err) || err.Error() != `deployment "x" not found` {
		t.Fatalf("%T %v", err, err)
	}
}

func TestUnreachableIsATransportError(t *testing.T) {
	c, _ := New("/nonexistent/starling.sock")
	_, err := c.Version(context.Background())
	var te *TransportError
	if !errors.As(err, &te) || te.Pin {
		t.Fatalf("%T %v", err, err)
	}
}

func TestRoutePathFillsAndEscapes(t *testing.T) {
	if got := api.RouteObject.Path("deployment", "default", "a/b"); got != "/v1/objects/deployment/default/a%2Fb" {
		t.Fatal(got)
	}
	if got := api.RouteNodes.Path(); got != "/v1/nodes" {
		t.Fatal(got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a missing argument did not panic")
		}
	}()
	api.RouteObject.Path("deployment")
}

func TestHTTPSNeedsPins(t *testing.T) {
	if _, err := New("https://192.0.2.1:7443"); err == nil {
		t.Fatal("https without pins accepted")
	}
	if _, err := New("192.0.2.1:7443"); err == nil {
		t.Fatal("host:port without scheme accepted")
	}
}
