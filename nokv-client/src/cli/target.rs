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

impl Target {
    /// `WS:PREFIX`, or a bare `WS` meaning the workspace root (as `grep` takes it): for `ls`
    /// and `find`.
    pub fn workspace_or_prefix(s: &str) -> Result<Target, String> {
        if s.contains(':') {
            return s.parse();
        }
        if s.is_empty() {
            return Err("expected WS or WS:PREFIX, got an empty argument".into());
        }
        Ok(Target {
            workspace: s.to_string(),
            path: String::new(),
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.workspace, self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_workspace_means_its_root_where_a_prefix_is_taken_and_nowhere_else() {
        let root = Target {
            workspace: "demo".into(),
            path: String::new(),
        };
        assert_eq!(Target::workspace_or_prefix("demo"), Ok(root.clone()));
        assert_eq!(Target::workspace_or_prefix("demo:"), Ok(root));
        assert_eq!(
            Target::workspace_or_prefix("demo:src/").unwrap().path,
            "src/"
        );
        assert!(Target::workspace_or_prefix("").is_err());
        assert!(Target::workspace_or_prefix(":x").is_err());
        assert!("demo".parse::<Target>().is_err(), "a file needs WS:PATH");
    }
}
