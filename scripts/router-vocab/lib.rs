//! Empty: this package exists to be fetched (see Cargo.toml).
