# The sandboxd daemon's own image. It drives the host's Docker engine through
# the engine's socket, mounted in; workspaces are sibling containers.
#
#   scripts/build-daemon-image            # wheels on the host, then this file (offline-friendly)
#   docker run -d --name sandboxd \
#     -v /var/run/docker.sock:/var/run/docker.sock \
#     --group-add "$(stat -c %g /var/run/docker.sock)" \
#     -v /run/sandboxd:/run/sandboxd sandboxd/daemon
#
# BASE_IMAGE is a build argument: an official Python image on hosts with a
# registry (the default), or a Debian base built locally from Debian packages
# (scripts/build-daemon-image passes sandboxd/debian:bookworm when no registry
# answers). Python packages come from wheels built on the host (build/wheels),
# so the build itself needs no PyPI access.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PYTHONUNBUFFERED=1
# Debian's own python3 (3.11 on bookworm) when the base has no Python with venv.
RUN if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    fi

COPY build/wheels /tmp/wheels
RUN python3 -m venv /opt/sandboxd \
 && /opt/sandboxd/bin/pip install --no-index --find-links /tmp/wheels sandboxd sandboxd-client \
 && rm -rf /tmp/wheels

# Non-root: access to the engine comes from the socket's group (--group-add / group_add).
RUN groupadd --gid 10001 sandboxd \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin sandboxd \
 && install -d -o sandboxd -g sandboxd -m 0700 /run/sandboxd /var/lib/sandboxd

ENV PATH=/opt/sandboxd/bin:$PATH \
    SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock \
    SANDBOXD_INSTANCE=container \
    SANDBOXD_AUDIT_LOG=/var/lib/sandboxd/audit.jsonl \
    SANDBOXD_LOG_FORMAT=json
USER sandboxd
# The socket, and the audit trail (keep it: mount a volume or host directory there).
VOLUME ["/run/sandboxd", "/var/lib/sandboxd"]
EXPOSE 50051
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=3 CMD ["sandboxctl", "health"]
ENTRYPOINT ["sandboxd"]
CMD ["serve"]
