//! The one error type of configuration: [`ConfigError`], a one-line refusal naming the setting
//! at fault. A leaf: every other file of the module returns it, and it imports none of them.

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);
