package api

import (
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Errors are Kubernetes' (k8s.io/apimachinery/pkg/api/errors): the agent
// answers a failed request with a metav1.Status body and its HTTP code,
// and the client turns that body back into an *apierrors.StatusError, so
// callers test errors with apierrors.IsNotFound, IsConflict, IsInvalid,
// IsUnauthorized, ... instead of matching strings. An invalid object's
// Status lists every field at fault in Details.Causes.

// Error is the body of every failed request: a metav1.Status, plus its
// message under "error" as agents before the Status shape sent it.
type Error struct {
	metav1.Status `json:",inline"`
	Error         string `json:"error"`
}

// ErrorBody is err as the body of a failed request, with its HTTP code:
// the Status of an apierrors.APIStatus error, 500 for any other.
func ErrorBody(err error) (int, Error) {
	var st apierrors.APIStatus
	var s metav1.Status
	if errors.As(err, &st) {
		s = st.Status()
	} else {
		s = apierrors.NewInternalError(err).Status()
		s.Message = err.Error()
	}
	s.Kind, s.APIVersion, s.Status = "Status", "v1", metav1.StatusFailure
	if s.Code == 0 {
		s.Code = http.StatusInternalServerError
	}
	return int(s.Code), Error{Status: s, Error: s.Message}
}

// AsError turns the body of a failed request with HTTP code code into an
// *apierrors.StatusError (an agent that sent only "error" gets the reason
// its code implies).
func (e Error) AsError(code int) error {
	s := e.Status
	if s.Message == "" {
		s.Message = e.Error
	}
	if s.Code == 0 {
		s.Code = int32(code)
	}
	if s.Reason == "" {
		s.Reason = reasonFor(int(s.Code))
	}
	s.Status = metav1.StatusFailure
	return &apierrors.StatusError{ErrStatus: s}
}

// ReasonRevoked is the reason of a 403 from a node's peer port to a node
// whose key 'starling node forget' revoked: the caller was forgotten.
const ReasonRevoked metav1.StatusReason = "Revoked"

// RevokedError is the peer port's answer to a revoked node (403,
// ReasonRevoked), with err's message.
func RevokedError(err error) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: ReasonRevoked, Message: err.Error()}}
}

// IsRevoked reports whether err (or an error it wraps) is a peer's
// RevokedError.
func IsRevoked(err error) bool {
	return apierrors.ReasonForError(err) == ReasonRevoked
}

// Errorf is an error with HTTP code code (its reason follows from the
// code) and a message as fmt.Errorf makes it.
func Errorf(code int, format string, args ...any) error {
	return NewError(code, fmt.Errorf(format, args...))
}

// NewError wraps err as an error with HTTP code code; its message is
// err's. A 422 lists the field errors err carries (a field.ErrorList
// turned into an aggregate, as manifest validation returns) as causes.
func NewError(code int, err error) error {
	s := metav1.Status{Status: metav1.StatusFailure, Code: int32(code), Reason: reasonFor(code), Message: err.Error()}
	if code == http.StatusUnprocessableEntity {
		if causes := fieldCauses(err); len(causes) > 0 {
			s.Details = &metav1.StatusDetails{Causes: causes}
		}
	}
	return &apierrors.StatusError{ErrStatus: s}
}

// fieldCauses are the field errors in err, as Status causes.
func fieldCauses(err error) []metav1.StatusCause {
	var out []metav1.StatusCause
	var walk func(error)
	walk = func(err error) {
		var fe *field.Error
		var agg utilerrors.Aggregate
		switch {
		case errors.As(err, &agg):
			for _, e := range agg.Errors() {
				walk(e)
			}
		case errors.As(err, &fe):
			out = append(out, metav1.StatusCause{Type: metav1.CauseType(fe.Type), Message: fe.ErrorBody(), Field: fe.Field})
		default:
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				for _, e := range j.Unwrap() {
					walk(e)
				}
			}
		}
	}
	walk(err)
	return out
}

// reasonFor is the Status reason of an HTTP code, as the Kubernetes API
// server gives it.
func reasonFor(code int) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusUnauthorized:
		return metav1.StatusReasonUnauthorized
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusMethodNotAllowed:
		return metav1.StatusReasonMethodNotAllowed
	case http.StatusRequestTimeout:
		return metav1.StatusReasonTimeout
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusRequestEntityTooLarge:
		return metav1.StatusReasonRequestEntityTooLarge
	case http.StatusUnprocessableEntity:
		return metav1.StatusReasonInvalid
	case http.StatusTooManyRequests:
		return metav1.StatusReasonTooManyRequests
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusGatewayTimeout:
		return metav1.StatusReasonTimeout
	}
	if code >= 500 {
		return metav1.StatusReasonInternalError
	}
	return metav1.StatusReasonUnknown
}
