//! Bearer-token authentication of the `/v1` routes.
//!
//! The token comes from `--token-file` (its first line, surrounding whitespace trimmed) or the
//! `SWITCHBOARD_TOKEN` environment variable; `--no-auth` turns checking off, and is accepted only
//! on a loopback address. With neither a token nor `--no-auth` the server refuses to start and
//! says how to give one. Tokens are compared in constant time (the time depends only on the
//! expected token's length, never on how much of a guess matches).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use super::errors::{ServeError, TokenProblem};

/// The environment variable the token is read from when `--token-file` is not given.
pub const TOKEN_ENV: &str = "SWITCHBOARD_TOKEN";

/// How `/v1` requests are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// `Authorization: Bearer <token>` must carry exactly this token.
    Token(Arc<[u8]>),
    /// Anyone on the (loopback) address may call (`--no-auth`).
    Disabled,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Token(_) => f.write_str("Auth::Token(<redacted>)"),
            Auth::Disabled => f.write_str("Auth::Disabled"),
        }
    }
}

impl Auth {
    /// What a cluster node publishes of its token, so that nodes serving with different tokens
    /// refuse to join one cluster: `none` without one, else `sha256:` and the first 32 hex digits
    /// of the SHA-256 of `switchboard-cluster-token-v1`, NUL, the token (never the token itself).
    pub fn cluster_digest(&self) -> String {
        use sha2::Digest as _;
        match self {
            Auth::Disabled => "none".to_string(),
            Auth::Token(token) => {
                let mut hash = sha2::Sha256::new();
                hash.update(b"switchboard-cluster-token-v1\0");
                hash.update(token);
                let hex: String = hash.finalize()[..16]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!("sha256:{hex}")
            }
        }
    }

    /// A token given directly (library users, tests).
    pub fn token(token: &str) -> Result<Auth, ServeError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(TokenProblem::Empty.into());
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenProblem::NotPrintable.into());
        }
        Ok(Auth::Token(Arc::from(token.as_bytes())))
    }

    /// Decides authentication from the command line: `--no-auth` (loopback only), else
    /// `--token-file`, else the `SWITCHBOARD_TOKEN` value `env_token`.
    pub(crate) fn resolve(
        listen: SocketAddr,
        token_file: Option<&Path>,
        env_token: Option<String>,
        no_auth: bool,
    ) -> Result<Auth, String> {
        if no_auth {
            if token_file.is_some() {
                return Err("--no-auth and --token-file contradict each other; give one".into());
            }
            if !listen.ip().is_loopback() {
                return Err(format!(
                    "--no-auth is refused on {listen}: it is not a loopback address, so anyone who can reach it could run commands; give a token (--token-file FILE or {TOKEN_ENV}) or listen on 127.0.0.1"
                ));
            }
            return Ok(Auth::Disabled);
        }
        if let Some(path) = token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?;
            let first = text.lines().next().unwrap_or_default();
            return Auth::token(first).map_err(|e| format!("--token-file {}: {e}", path.display()));
        }
        match env_token {
            Some(t) => Auth::token(&t).map_err(|e| format!("{TOKEN_ENV}: {e}")),
            None => Err(format!(
                "no token: give one with --token-file FILE or the {TOKEN_ENV} environment variable, or pass --no-auth to serve a loopback address without one"
            )),
        }
    }

    /// True when the request's `Authorization` header value carries the right token.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        match self {
            Auth::Disabled => true,
            Auth::Token(expected) => {
                let Some(value) = authorization else {
                    return false;
                };
                let presented = match value.get(..7) {
                    Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
                    _ => return false,
                };
                constant_time_eq(expected, presented.trim_ascii())
            }
        }
    }
}

/// Compares `presented` with `expected` in time that depends only on `expected.len()`.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != presented.len());
    for (i, e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(!e);
        diff |= e ^ p;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_auth_is_refused_off_loopback() {
        let e = Auth::resolve(addr("0.0.0.0:7420"), None, None, true).unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
        let e = Auth::resolve(addr("[::]:7420"), None, None, true).unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
        assert!(matches!(
            Auth::resolve(addr("127.0.0.1:0"), None, None, true),
            Ok(Auth::Disabled)
        ));
        assert!(matches!(
            Auth::resolve(addr("[::1]:0"), None, None, true),
            Ok(Auth::Disabled)
        ));
    }

    #[test]
    fn an_unusable_token_is_refused_with_a_typed_reason() {
        assert!(matches!(
            Auth::token("  "),
            Err(ServeError::Auth(TokenProblem::Empty))
        ));
        let e = Auth::token("two words").unwrap_err();
        assert!(matches!(e, ServeError::Auth(TokenProblem::NotPrintable)));
        assert_eq!(
            e.to_string(),
            "the token must be printable ASCII without spaces"
        );
        assert!(Auth::token("s3cret-token").is_ok());
    }

    #[test]
    fn without_a_token_the_error_says_how_to_give_one() {
        let e = Auth::resolve(addr("127.0.0.1:0"), None, None, false).unwrap_err();
        assert!(e.contains("--token-file") && e.contains(TOKEN_ENV) && e.contains("--no-auth"));
    }

    #[test]
    fn the_token_file_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "file-token\n").unwrap();
        let auth = Auth::resolve(
            addr("0.0.0.0:1"),
            Some(&path),
            Some("env-token".into()),
            false,
        )
        .unwrap();
        assert!(auth.allows(Some(b"Bearer file-token")));
        assert!(!auth.allows(Some(b"Bearer env-token")));
    }

    #[test]
    fn only_the_exact_bearer_token_is_allowed() {
        let auth = Auth::token("s3cret").unwrap();
        assert!(auth.allows(Some(b"Bearer s3cret")));
        assert!(auth.allows(Some(b"bearer s3cret")));
        for wrong in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"Bearer S3cret",
            b"Basic s3cret",
            b"s3cret",
            b"Bearer ",
            b"",
        ] {
            assert!(
                !auth.allows(Some(wrong)),
                "{}",
                String::from_utf8_lossy(wrong)
            );
        }
        assert!(!auth.allows(None));
        assert!(Auth::token("  ").is_err());
    }
}
