package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"
)

// formats are -o's values: table and wide are for people (wide adds
// columns), json and yaml for scripts.
var formats = []string{"table", "wide", "json", "yaml"}

func (g *globals) wide() bool { return g.format == "wide" }

// output writes resp on stdout as -o says: the command's table, or resp as
// JSON or YAML (see jsonValue).
func output[T proto.Message](cmd *cobra.Command, g *globals, resp T, table func(io.Writer, T)) error {
	v, err := jsonValue(resp)
	if err != nil {
		return err
	}
	return emit(cmd, g, v, func(w io.Writer) { table(w, resp) })
}

// emit writes v, a value encoding/json renders, on stdout as -o says: JSON,
// YAML, or table's text for table and wide.
func emit(cmd *cobra.Command, g *globals, v any, table func(io.Writer)) error {
	out := cmd.OutOrStdout()
	switch g.format {
	case "json", "yaml":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if g.format == "yaml" {
			if b, err = yaml.JSONToYAML(b); err != nil {
				return err
			}
			_, err = out.Write(b)
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// jsonValue is m as the HTTP query API writes its answers: field names as
// the .proto spells them (snake_case), 64-bit integers as JSON numbers
// (protojson writes them as strings, for JavaScript's doubles), timestamps
// as RFC 3339 and durations as "20s" strings, enums by name, empty fields
// left out.
func jsonValue(m proto.Message) (any, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	numbers(m.ProtoReflect().Descriptor(), v)
	return v, nil
}

// numbers turns the 64-bit integer fields of v, the JSON object of a
// message md describes, from strings into numbers, at every depth.
func numbers(md protoreflect.MessageDescriptor, v any) {
	obj, ok := v.(map[string]any)
	if !ok {
		return
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		val, ok := obj[fd.TextName()]
		if !ok {
			continue
		}
		switch {
		case fd.IsMap():
			if m, ok := val.(map[string]any); ok {
				for k, x := range m {
					m[k] = number(fd.MapValue(), x)
				}
			}
		case fd.IsList():
			if l, ok := val.([]any); ok {
				for j, x := range l {
					l[j] = number(fd, x)
				}
			}
		default:
			obj[fd.TextName()] = number(fd, val)
		}
	}
}

func number(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		// Well-known types have JSON forms of their own (a timestamp is a
		// string), not objects of their fields.
		if !strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
			numbers(fd.Message(), v)
		}
	}
	return v
}
