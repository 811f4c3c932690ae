//! TLS for the HTTP clients the engine makes (model providers, MCP servers over HTTP): one
//! rustls crypto provider for the whole process.

/// Installs `ring` as the process's rustls crypto provider (once; a provider installed earlier
/// by the host program is kept).
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
