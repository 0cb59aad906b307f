# syntax=docker/dockerfile:1
# Prism's image for people with Docker. `make image` builds the same image with
# no Docker engine (tools/image); this file is not built here (no Docker on the
# build machines), and tools/image's TestDockerfileInStep holds its user,
# entrypoint, working directory, environment and labels to what make image
# makes. Both give a static CGO_ENABLED=0 prism without debug symbols in
# /usr/local/bin and prismctl beside it, a symbolic link to prism (which is
# prismctl when run by that name), user nonroot 65532:65532, the CA bundle at
# /etc/ssl/certs/ca-certificates.crt and a nonroot-owned /var/lib/prism;
# distroless/static adds tzdata and a few more files to what tools/image lays
# down from scratch. Both platforms, reproducibly, as make image names it:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) \
#     --build-arg CREATED=$(date -u -d @$(git log -1 --format=%ct) +%FT%TZ) \
#     -t ghcr.io/prism-mesh/prism:0.1.0 .

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
      go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/bin/prism ./cmd/prism && \
    ln -s prism /out/bin/prismctl && \
    mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=
ARG CREATED=
LABEL org.opencontainers.image.title="prism" \
      org.opencontainers.image.description="Prism mailbox mesh: prism (admin, runner, sidecar, gateway, inject) and prismctl" \
      org.opencontainers.image.source="https://github.com/prism-mesh/prism" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# The directory, not its files by name: COPY keeps a symbolic link inside a
# directory it copies, but follows one it is given and would copy prism twice.
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /var/lib/prism
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /var/lib/prism
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/prism"]
