package cache

import (
	"bytes"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// equal is proto.Equal with one shortcut: the same message pointer on both
// sides is equal without a walk. The translator shares the route objects of
// unchanged mailboxes between route tables, so comparing two 10,000-mailbox
// tables costs pointer compares for all but the changed routes instead of a
// full walk (tens of milliseconds on every change).
func equal(a, b protoreflect.Message) bool {
	if a.Interface() == b.Interface() {
		return true
	}
	if a.Descriptor() != b.Descriptor() || a.IsValid() != b.IsValid() {
		return false
	}
	fields := a.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if a.Has(fd) != b.Has(fd) {
			return false
		}
		if !a.Has(fd) {
			continue
		}
		va, vb := a.Get(fd), b.Get(fd)
		switch {
		case fd.IsList() && fd.Message() != nil:
			la, lb := va.List(), vb.List()
			if la.Len() != lb.Len() {
				return false
			}
			for j := 0; j < la.Len(); j++ {
				if !equal(la.Get(j).Message(), lb.Get(j).Message()) {
					return false
				}
			}
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			if !equal(va.Message(), vb.Message()) {
				return false
			}
		default:
			if !va.Equal(vb) {
				return false
			}
		}
	}
	return bytes.Equal(a.GetUnknown(), b.GetUnknown())
}
