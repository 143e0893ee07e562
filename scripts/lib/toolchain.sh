# Shared by the quick-start scripts: make sure a Rust toolchain new enough for
# this workspace (edition 2024) is on PATH. The toolchain cannot be installed
# from Debian (bookworm ships rustc 1.63), so a missing one is a clear error.
require_toolchain() {
  if [ -d "$HOME/.cargo/bin" ]; then PATH="$HOME/.cargo/bin:$PATH"; fi
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found. Install Rust >= 1.90 with rustup (https://rustup.rs), then rerun." >&2
    exit 1
  fi
  local v
  v=$(rustc --version | awk '{print $2}')
  local minor=${v#1.}; minor=${minor%%.*}
  if [ "${minor:-0}" -lt 90 ]; then
    echo "error: rustc $v is too old; this workspace needs >= 1.90 (edition 2024)." >&2
    exit 1
  fi
  if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then rustup component add rustfmt clippy; fi
  fi
}
