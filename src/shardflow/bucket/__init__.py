"""Object storage: builds, pushes, lifecycle and URLs of versions on a bucket."""
