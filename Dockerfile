# The sandboxd daemon's own image. It talks to the host's engine through the
# mounted Docker socket:
#   docker build -t sandboxd .
#   docker run -v /var/run/docker.sock:/var/run/docker.sock -v sandboxd-run:/run/sandboxd sandboxd
# BASE_IMAGE is a build argument so hosts without a registry can pass a local base.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
COPY client /src/client
COPY pyproject.toml README.md /src/
COPY sandboxd /src/sandboxd
COPY images /src/images
RUN python3 -m pip install --no-cache-dir /src/client /src
ENV SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock
ENTRYPOINT ["sandboxd"]
CMD ["serve"]
