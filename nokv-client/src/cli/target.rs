//! `WS:PATH` arguments. Only the split happens here; the server validates the names, so the
//! CLI and every other client share one definition of a valid path.

/// A `WS:PATH` (or `WS:PREFIX`) argument.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub workspace: String,
    pub path: String,
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Target, String> {
        match s.split_once(':') {
            Some((ws, path)) if !ws.is_empty() => Ok(Target {
                workspace: ws.to_string(),
                path: path.to_string(),
            }),
            _ => Err(format!("expected WS:PATH, got {s:?}")),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.workspace, self.path)
    }
}
