//! [`ToolError`]: a handler's failure — a stable [`ErrorCode`] and a detail. It sits beside the
//! codes so that everything below the tool layer (the workspace, file stamps, access functions)
//! can fail with one.

use std::fmt;

use super::ErrorCode;

/// A handler's failure: a stable code and a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// The stable code.
    pub code: ErrorCode,
    /// The detail after `Error [<code>]: `.
    pub detail: String,
}

impl ToolError {
    /// An error with any code.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ToolError {
            code,
            detail: detail.into(),
        }
    }
    /// `execution_error`: the handler ran and failed.
    pub fn execution(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::ExecutionError, detail)
    }
    /// `permission_denied`: refused by policy.
    pub fn permission(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::PermissionDenied, detail)
    }
    /// `invalid_arguments`: the arguments passed the schema but still cannot be used.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArguments, detail)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error [{}]: {}", self.code, self.detail)
    }
}

impl std::error::Error for ToolError {}
