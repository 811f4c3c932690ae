//! Access declarations: what one call reads and writes, so the planner can tell which calls of a
//! turn may overlap.
//!
//! A tool declares a function from its validated arguments (and the session's workspace) to an
//! [`Access`]: either a set of `(Resource, Mode)` pairs or [`Access::Exclusive`]. Two calls
//! **conflict** when either is exclusive, or when they touch overlapping resources and at least
//! one of them writes (read/read never conflicts). Resources overlap when
//!
//! * both are workspace paths and one is the other or an ancestor of it (component-wise: `a`
//!   overlaps `a/b.txt`, not `ab`); the workspace root `.` overlaps every path;
//! * both are the same named resource ([`Resource::named`], e.g. `db:users`).
//!
//! A path never overlaps a named resource. Paths are normalised the way the workspace confinement
//! normalises them ([`Workspace::relative`]): lexically, workspace-relative, `.` segments dropped,
//! absolute paths inside the root made relative. Symlinks and hard links are not seen: two names
//! of one file are two resources (see `docs/scheduling.md`).
//!
//! Without an access function a tool falls back on its policy: `concurrency_safe(true)` means
//! [`Access::none`] (conflicts only with exclusive calls), `false` means [`Access::Exclusive`].
//! An access function that returns an error or panics makes its call exclusive: never a crash,
//! never an unsafe overlap.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::tool::ToolError;
use crate::workspace::Workspace;

/// Something a call reads or writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    /// A workspace-relative, lexically normalised path (`.` is the workspace root).
    Path(PathBuf),
    /// A named resource of a custom tool (`db:users`, `service:billing`).
    Named(Arc<str>),
}

impl Resource {
    /// The workspace path `path` as the confinement sees it ([`Workspace::relative`]); the
    /// confinement's refusal (a path outside the workspace, `..`, NUL, …) is the error.
    pub fn path(ws: &Workspace, path: &str) -> Result<Resource, ToolError> {
        ws.relative(path).map(Resource::Path)
    }

    /// The whole workspace (overlaps every path).
    pub fn root() -> Resource {
        Resource::Path(PathBuf::from("."))
    }

    /// A named resource; equal names are the same resource.
    pub fn named(name: impl Into<Arc<str>>) -> Resource {
        Resource::Named(name.into())
    }

    /// True when the two resources share anything (see the module docs).
    pub fn overlaps(&self, other: &Resource) -> bool {
        match (self, other) {
            (Resource::Path(a), Resource::Path(b)) => paths_overlap(a, b),
            (Resource::Named(a), Resource::Named(b)) => a == b,
            _ => false,
        }
    }
}

fn paths_overlap(a: &Path, b: &Path) -> bool {
    let root = Path::new(".");
    a == root || b == root || a.starts_with(b) || b.starts_with(a)
}

/// How a call uses a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Looks at it (two reads never conflict).
    Read,
    /// Changes it (creates, replaces, edits or removes).
    Write,
}

/// What one call touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// These resources, each read or written (empty: touches nothing a declared call touches).
    Set(Vec<(Resource, Mode)>),
    /// Conflicts with every other call (runs alone, after everything before it).
    Exclusive,
}

impl Access {
    /// Touches nothing declared: conflicts only with exclusive calls (no allocation).
    pub fn none() -> Access {
        Access::Set(Vec::new())
    }

    /// Reads one resource.
    pub fn read(resource: Resource) -> Access {
        Access::Set(vec![(resource, Mode::Read)])
    }

    /// Writes one resource.
    pub fn write(resource: Resource) -> Access {
        Access::Set(vec![(resource, Mode::Write)])
    }

    /// This access plus `resource` in `mode` (an exclusive access stays exclusive).
    pub fn and(self, resource: Resource, mode: Mode) -> Access {
        match self {
            Access::Set(mut set) => {
                set.push((resource, mode));
                Access::Set(set)
            }
            Access::Exclusive => Access::Exclusive,
        }
    }

    /// True for [`Access::Exclusive`].
    pub fn is_exclusive(&self) -> bool {
        matches!(self, Access::Exclusive)
    }

    /// True when the two calls may not overlap: either is exclusive, or they touch overlapping
    /// resources and at least one of the two writes.
    pub fn conflicts(&self, other: &Access) -> bool {
        match (self, other) {
            (Access::Exclusive, _) | (_, Access::Exclusive) => true,
            (Access::Set(a), Access::Set(b)) => a.iter().any(|(ra, ma)| {
                b.iter()
                    .any(|(rb, mb)| (*ma == Mode::Write || *mb == Mode::Write) && ra.overlaps(rb))
            }),
        }
    }
}

/// The signature of an access function: validated arguments and the session's workspace (if it
/// has one) to the call's access, or why it cannot tell (the call is then exclusive).
pub type AccessFnSig =
    dyn Fn(&Value, Option<&Workspace>) -> Result<Access, ToolError> + Send + Sync;

/// A tool's access function (see [`crate::ToolSpec::access`]).
#[derive(Clone)]
pub struct AccessFn(Arc<AccessFnSig>);

impl AccessFn {
    /// Wraps a function.
    pub fn new<F>(f: F) -> Self
    where
        F: Fn(&Value, Option<&Workspace>) -> Result<Access, ToolError> + Send + Sync + 'static,
    {
        AccessFn(Arc::new(f))
    }

    /// The call's access: what the function says, or [`Access::Exclusive`] when it errs or
    /// panics.
    pub fn eval(&self, args: &Value, ws: Option<&Workspace>) -> Access {
        match catch_unwind(AssertUnwindSafe(|| (self.0)(args, ws))) {
            Ok(Ok(access)) => access,
            Ok(Err(e)) => {
                tracing::debug!(detail = %e.detail, "access function refused; the call runs exclusive");
                Access::Exclusive
            }
            Err(_) => {
                tracing::warn!("access function panicked; the call runs exclusive");
                Access::Exclusive
            }
        }
    }
}

impl fmt::Debug for AccessFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessFn")
    }
}

/// The access of one call of a tool: its access function's answer, or the policy's fallback
/// (`concurrency_safe` → [`Access::none`], otherwise [`Access::Exclusive`]).
pub fn access_of(
    access: Option<&AccessFn>,
    concurrency_safe: bool,
    args: &Value,
    ws: Option<&Workspace>,
) -> Access {
    match access {
        Some(f) => f.eval(args, ws),
        None if concurrency_safe => Access::none(),
        None => Access::Exclusive,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn p(s: &str) -> Resource {
        Resource::Path(PathBuf::from(s))
    }

    #[test]
    fn paths_overlap_hierarchically_and_the_root_overlaps_everything() {
        assert!(p("a").overlaps(&p("a/b.txt")));
        assert!(p("a/b.txt").overlaps(&p("a")));
        assert!(p("a/b.txt").overlaps(&p("a/b.txt")));
        assert!(!p("a").overlaps(&p("ab")));
        assert!(!p("a/b.txt").overlaps(&p("a/c.txt")));
        assert!(p(".").overlaps(&p("x/y/z")));
        assert!(p("x").overlaps(&Resource::root()));
        assert!(!p("db").overlaps(&Resource::named("db")));
        assert!(Resource::named("db:users").overlaps(&Resource::named("db:users")));
        assert!(!Resource::named("db:users").overlaps(&Resource::named("db:orders")));
    }

    #[test]
    fn only_a_write_to_an_overlapping_resource_or_exclusive_conflicts() {
        let r = Access::read(p("a/b"));
        let w = Access::write(p("a/b"));
        assert!(!r.conflicts(&r));
        assert!(r.conflicts(&w) && w.conflicts(&r) && w.conflicts(&w));
        assert!(!w.conflicts(&Access::write(p("a/c"))));
        assert!(Access::read(p("a")).conflicts(&w));
        assert!(!Access::none().conflicts(&w));
        assert!(Access::none().conflicts(&Access::Exclusive));
        assert!(Access::Exclusive.conflicts(&Access::none()));
        assert!(Access::write(Resource::named("q")).conflicts(&Access::read(Resource::named("q"))));
    }

    #[test]
    fn paths_are_normalised_like_the_confinement_and_escapes_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        assert_eq!(Resource::path(&ws, "./a//b.txt").unwrap(), p("a/b.txt"));
        let abs = ws.root().join("a/b.txt");
        assert_eq!(
            Resource::path(&ws, abs.to_str().unwrap()).unwrap(),
            p("a/b.txt")
        );
        assert_eq!(Resource::path(&ws, "./").unwrap(), p("."));
        assert!(Resource::path(&ws, "../x").is_err());
        assert!(Resource::path(&ws, "/etc/passwd").is_err());
    }

    #[test]
    fn a_failing_or_panicking_access_function_makes_the_call_exclusive() {
        let erring = AccessFn::new(|_, _| Err(ToolError::invalid("no")));
        assert_eq!(erring.eval(&json!({}), None), Access::Exclusive);
        let panicking = AccessFn::new(|_, _| panic!("boom"));
        assert_eq!(panicking.eval(&json!({}), None), Access::Exclusive);
        let fine = AccessFn::new(|_, _| Ok(Access::read(Resource::named("x"))));
        assert_eq!(
            access_of(Some(&fine), false, &json!({}), None),
            Access::read(Resource::named("x"))
        );
        assert_eq!(access_of(None, true, &json!({}), None), Access::none());
        assert_eq!(access_of(None, false, &json!({}), None), Access::Exclusive);
    }
}
