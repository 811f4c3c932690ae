//! [`Subject`]: what a call touches (a path, a command), as its tool declares it from the
//! validated arguments. Permission rules match against it; the tool knows nothing of rules.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// What a call touches, as the tool declares it from its validated arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A path inside the session's workspace (as the model wrote it; confined before matching).
    Path(String),
    /// A shell command.
    Command(String),
}

impl Subject {
    /// The subject's text (path or command).
    pub fn text(&self) -> &str {
        match self {
            Subject::Path(s) | Subject::Command(s) => s,
        }
    }
}

/// A tool's subject function: the path or command a call with these (validated) arguments
/// touches.
pub type SubjectFn = dyn Fn(&Value) -> Option<Subject> + Send + Sync;

/// A tool's [`SubjectFn`], shared.
#[derive(Clone)]
pub struct SubjectOf(pub Arc<SubjectFn>);

impl SubjectOf {
    /// The subject of a call with these arguments.
    pub fn of(&self, args: &Value) -> Option<Subject> {
        (self.0)(args)
    }
}

impl fmt::Debug for SubjectOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SubjectOf(..)")
    }
}
