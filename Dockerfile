# The driver alone in a distroless image: it runs no other program, so the
# image needs no shell, util-linux, coreutils or tar.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /hostpathplugin ./cmd/hostpathplugin

FROM gcr.io/distroless/static
COPY --from=build /hostpathplugin /hostpathplugin
ENTRYPOINT ["/hostpathplugin"]
