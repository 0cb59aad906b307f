package main

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfileInStep: nothing here can build the Dockerfile (no Docker), so
// its final stage is held to what make image makes: user, entrypoint, working
// directory, environment, labels, a static stripped build of prism, and
// prismctl a symbolic link to it, copied as one.
func TestDockerfileInStep(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var instrs []string
	cur := ""
	for _, line := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if rest, ok := strings.CutSuffix(l, "\\"); ok {
			cur += rest + " "
			continue
		}
		if cur += l; strings.TrimSpace(cur) != "" {
			instrs = append(instrs, strings.Join(strings.Fields(cur), " "))
		}
		cur = ""
	}
	last := -1
	for i, in := range instrs {
		if strings.HasPrefix(in, "FROM ") {
			last = i
		}
	}
	if last < 1 {
		t.Fatalf("Dockerfile has no build stage and final stage: %q", instrs)
	}
	build, final := strings.Join(instrs[:last], "\n"), instrs[last:]
	for _, want := range []string{
		`CGO_ENABLED=0`,
		`-ldflags "-s -w -X main.version=${VERSION}" -o /out/bin/prism ./cmd/prism `,
		`ln -s prism /out/bin/prismctl `,
	} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage lacks %s:\n%s", want, build)
		}
	}

	spec := Spec{Source: defaultSource, Version: "${VERSION}", Revision: "${REVISION}"}
	want := imageConfig(spec)
	want.Labels["org.opencontainers.image.created"] = "${CREATED}"
	pair := regexp.MustCompile(`([^\s=]+)=("[^"]*"|\S+)`)
	labels, got := map[string]string{}, map[string]string{}
	var env []string
	for _, in := range final {
		op, args, _ := strings.Cut(in, " ")
		switch op {
		case "LABEL", "ENV":
			for _, m := range pair.FindAllStringSubmatch(args, -1) {
				v := strings.Trim(m[2], `"`)
				if op == "LABEL" {
					labels[m[1]] = v
				} else {
					env = append(env, m[1]+"="+v)
				}
			}
		default:
			got[op] = args
		}
	}
	if !maps.Equal(labels, want.Labels) {
		t.Errorf("Dockerfile labels %v,\nmake image's %v", labels, want.Labels)
	}
	if !slices.Equal(env, want.Env) {
		t.Errorf("Dockerfile ENV %v, make image's %v", env, want.Env)
	}
	var entrypoint []string
	if err := json.Unmarshal([]byte(got["ENTRYPOINT"]), &entrypoint); err != nil || !slices.Equal(entrypoint, want.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %s (%v), make image's %q", got["ENTRYPOINT"], err, want.Entrypoint)
	}
	for _, tc := range []struct{ op, want string }{
		{"USER", want.User},
		{"WORKDIR", want.WorkingDir},
		{"FROM", "gcr.io/distroless/static-debian12:nonroot"},
	} {
		if got[tc.op] != tc.want {
			t.Errorf("Dockerfile %s %q, make image's %q", tc.op, got[tc.op], tc.want)
		}
	}
	// /out/bin/ is copied whole: COPY follows a symbolic link named as its
	// source, and prismctl would be a second prism.
	if !slices.Contains(final, "COPY --from=build /out/bin/ /"+binDir+"/") {
		t.Errorf("the final stage does not copy /out/bin/ (prism and the prismctl link) to /%s/:\n%s", binDir, strings.Join(final, "\n"))
	}
	if !slices.ContainsFunc(final, func(in string) bool {
		return strings.HasPrefix(in, "COPY --from=build --chown=65532:65532 ") && strings.HasSuffix(in, " /"+dataDir)
	}) {
		t.Errorf("the final stage does not make /%s owned by 65532", dataDir)
	}
}
