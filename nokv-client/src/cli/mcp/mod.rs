//! `nokv mcp`: an MCP server over stdio that gives an agent host (an LLM tool loop) the
//! workspace operations as tools, on top of the SDK — so every tool call is one SDK call with
//! its retries, request ids and owner routing.
//!
//! stdout carries the protocol and nothing else: logs go to stderr (the CLI's subscriber
//! writes there), and no tool prints. Protocol version negotiation is the `rmcp` SDK's.
//!
//! A configuration that cannot be used (no CA, `NOKV_CONFIG` naming a missing file, a token
//! that is not one) does not stop the server: a host shows a server that exits as nothing
//! more than "Connection closed", so it answers `initialize` and `tools/list` as usual and
//! every tool call with a `NotConfigured` tool error that names the problem and how to fix it.
//!
//! Three switches shape what a model can do, decided when the host starts the server:
//! * `--workspace WS` pins the workspace: the `workspace` argument disappears from every
//!   schema and a call naming another workspace is refused (`Usage`). Without it, `workspace`
//!   is a required argument of every tool.
//! * `--read-only` removes the tools that change the workspace from the tool list, and a call
//!   to one anyway is a tool error with reason `ReadOnly` (a host may call a tool it cached
//!   from an earlier session). `nokv_restore` goes too (it writes a file on this machine)
//!   unless `--allow-restore`.
//! * `--local-root DIR|none` confines the only two tools that touch this machine's files,
//!   nokv_publish (reads one) and nokv_restore (writes one), to files beneath DIR (default:
//!   the directory `nokv mcp` starts in); see [`local_root`]. `none` removes both.

mod local_root;
mod params;
mod receipt;
mod reply;
mod tools;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nokv_client::{Client, ClientError};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool_handler};
use serde_json::{Value, json};

/// The tools that change a workspace: absent in `--read-only` mode.
const WRITING_TOOLS: [&str; 5] = [
    "nokv_write",
    "nokv_edit",
    "nokv_append",
    "nokv_delete",
    "nokv_publish",
];

const INSTRUCTIONS: &str = "nokv stores agent workspaces: small text files (read, write, \
    edit, append, grep, find) and large artifacts (publish a local file, restore it to a local \
    file). Every entry has a generation that grows on each change: pass the generation you read \
    back as if_generation so a concurrent change is refused \
    (GenerationMismatch) instead of overwritten. Prefer nokv_edit over rewriting a file, and \
    nokv_grep / nokv_find over listing and reading everything. A failed call's text starts \
    with its reason (NotFound, GenerationMismatch, MatchCount, PermissionDenied, ...) and a \
    hint.";

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// Pin every tool to workspace WS: tools take no workspace argument and refuse another.
    #[arg(long, value_name = "WS")]
    workspace: Option<String>,
    /// Expose only the tools that do not change the workspace (stat, read, list, find, grep,
    /// health) — and not nokv_restore either, which writes files on this machine, unless
    /// --allow-restore is given.
    #[arg(long)]
    read_only: bool,
    /// With --read-only: keep nokv_restore (it writes local files, never the workspace).
    #[arg(long, requires = "read_only")]
    allow_restore: bool,
    /// The directory nokv_publish may read and nokv_restore may write files in (the only
    /// tools that touch this machine's files). Every local_path is resolved beneath it by the
    /// kernel: `..` above it, an absolute path outside it and a symbolic link leading out are
    /// refused. Default: the directory `nokv mcp` starts in. `none`: no local file at all
    /// (nokv_publish and nokv_restore are removed); a directory named none is `./none`.
    #[arg(long, value_name = "DIR|none")]
    local_root: Option<PathBuf>,
}

/// The tool that writes to the host's files (not the workspace): removed by --read-only
/// unless --allow-restore.
const HOST_WRITING_TOOL: &str = "nokv_restore";

/// The tools that touch the host's files: confined by --local-root, removed by
/// `--local-root none`.
const LOCAL_FILE_TOOLS: [&str; 2] = ["nokv_publish", HOST_WRITING_TOOL];

/// The MCP server: the SDK client plus what the host fixed at start.
#[derive(Clone)]
pub struct NokvMcp {
    /// The client, or why the configuration gave none: then every tool call is refused with
    /// [`reply::NOT_CONFIGURED`] (see [`not_configured`]).
    client: Result<Client, ClientError>,
    pinned: Option<String>,
    read_only: bool,
    /// True if nokv_restore is refused (read-only without --allow-restore).
    no_restore: bool,
    /// Where local files are confined; `None` with `--local-root none`.
    local_root: Option<Arc<local_root::LocalRoot>>,
    tool_router: ToolRouter<NokvMcp>,
}

impl NokvMcp {
    /// The server; fails if the `--local-root` directory cannot be opened. `client` is the
    /// configured client or the configuration's problem, which the server reports on every
    /// tool call instead of failing here.
    pub fn new(client: Result<Client, ClientError>, args: McpArgs) -> Result<NokvMcp, ClientError> {
        let local_root = match args.local_root {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(local_root::LocalRoot::open(&p)?),
            None => Some(local_root::LocalRoot::open(Path::new("."))?),
        };
        if let Some(r) = &local_root {
            tracing::info!(local_root = %r.path().display(), "local files confined");
        }
        let mut tool_router = Self::tool_router();
        let no_restore = args.read_only && !args.allow_restore;
        if args.read_only {
            for name in WRITING_TOOLS {
                tool_router.remove_route(name);
            }
        }
        if no_restore {
            tool_router.remove_route(HOST_WRITING_TOOL);
        }
        if local_root.is_none() {
            for name in LOCAL_FILE_TOOLS {
                tool_router.remove_route(name);
            }
        }
        for route in tool_router.map.values_mut() {
            match args.workspace {
                Some(_) => drop_workspace_argument(&mut route.attr),
                None => require_workspace_argument(&mut route.attr),
            }
        }
        if let Err(e) = &client {
            tracing::warn!(
                error = %e,
                "no usable configuration: every tool call will be refused with NotConfigured"
            );
        }
        Ok(NokvMcp {
            client,
            pinned: args.workspace,
            read_only: args.read_only,
            no_restore,
            local_root: local_root.map(Arc::new),
            tool_router,
        })
    }

    /// The client. Without one, [`ServerHandler::call_tool`] refuses every call before a tool
    /// runs, so a tool never meets this error in practice; it is here so that no tool can
    /// reach a server without a configuration.
    fn client(&self) -> Result<&Client, ClientError> {
        self.client
            .as_ref()
            .map_err(|e| ClientError::usage(not_configured(e)))
    }

    /// The local root, or the refusal of a local-file tool under `--local-root none`.
    fn local_root(
        &self,
        tool: &str,
    ) -> Result<&local_root::LocalRoot, rmcp::model::CallToolResult> {
        self.local_root.as_deref().ok_or_else(|| {
            reply::refused(
                reply::LOCAL_REFUSED,
                format!(
                    "{tool} touches files on this machine and this server was started with \
                     --local-root none: no local file can be read or written"
                ),
            )
        })
    }

    /// The workspace a call acts on: the pinned one, or the one it names.
    fn workspace(&self, given: Option<String>) -> Result<String, ClientError> {
        self.workspace_if_any(given)?.ok_or_else(|| {
            ClientError::usage(
                "no workspace: pass `workspace` (this server is not pinned to one with \
                 --workspace)",
            )
        })
    }

    /// As [`Self::workspace`], for tools that can do without one.
    fn workspace_if_any(&self, given: Option<String>) -> Result<Option<String>, ClientError> {
        match (&self.pinned, given) {
            (Some(p), Some(g)) if *p != g => Err(ClientError::usage(format!(
                "this server is pinned to workspace {p:?} (nokv mcp --workspace): {g:?} is \
                 refused; omit `workspace`"
            ))),
            (Some(p), _) => Ok(Some(p.clone())),
            (None, g) => Ok(g),
        }
    }
}

/// Removes the `workspace` property from a tool's input schema (the server is pinned).
fn drop_workspace_argument(tool: &mut Tool) {
    let mut schema = (*tool.input_schema).clone();
    if let Some(serde_json::Value::Object(props)) = schema.get_mut("properties") {
        props.remove("workspace");
    }
    if let Some(serde_json::Value::Array(required)) = schema.get_mut("required") {
        required.retain(|v| v != "workspace");
    }
    tool.input_schema = Arc::new(schema);
}

/// Makes `workspace` a required string in a tool's input schema: the server is not pinned,
/// so every call must name one (the field is an `Option` in [`params`] for the pinned case
/// only, which removes it).
fn require_workspace_argument(tool: &mut Tool) {
    let mut schema = (*tool.input_schema).clone();
    if let Some(Value::Object(props)) = schema.get_mut("properties")
        && let Some(Value::Object(ws)) = props.get_mut("workspace")
    {
        ws.insert("type".into(), json!("string"));
    }
    match schema.get_mut("required") {
        Some(Value::Array(required)) => {
            if !required.iter().any(|v| v == "workspace") {
                required.insert(0, json!("workspace"));
            }
        }
        _ => {
            schema.insert("required".into(), json!(["workspace"]));
        }
    }
    tool.input_schema = Arc::new(schema);
}

/// The text of every tool call's refusal when the configuration gave no client: the problem,
/// where the settings come from and what to change. The reader is the model, which can only
/// pass it on: the fix is in the host's entry for this server, and needs a restart.
fn not_configured(problem: &ClientError) -> String {
    format!(
        "nokv mcp has no usable configuration, so no tool can reach a nokv server: {problem}. \
         Fix it where the agent host starts this server (its MCP server entry) and restart \
         the server: set NOKV_ENDPOINT (https://HOST:PORT), NOKV_CA (the CA certificate file) \
         and NOKV_TOKEN in its environment, or NOKV_CONFIG=DATA_DIR/client.toml (the file \
         nokv-server writes into its data directory), or pass --endpoint, --ca and --token. \
         A token is issued with `nokv-server token issue`."
    )
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for NokvMcp {
    fn get_info(&self) -> ServerConfig {
        let instructions = match &self.pinned {
            Some(ws) => format!("{INSTRUCTIONS} Every tool acts on workspace {ws:?}."),
            None => INSTRUCTIONS.to_string(),
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("nokv", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.read_only && WRITING_TOOLS.contains(&request.name.as_ref()) {
            return Ok(reply::refused(
                reply::READ_ONLY,
                format!(
                    "{} changes the workspace and this server is read-only",
                    request.name
                ),
            )
            .into());
        }
        if self.no_restore && request.name == HOST_WRITING_TOOL {
            return Ok(reply::refused(
                reply::READ_ONLY,
                format!(
                    "{HOST_WRITING_TOOL} writes files on this machine and this server is \
                     read-only (nokv mcp --allow-restore keeps it)"
                ),
            )
            .into());
        }
        if LOCAL_FILE_TOOLS.contains(&request.name.as_ref())
            && let Err(refused) = self.local_root(&request.name)
        {
            return Ok(refused.into());
        }
        if let Err(problem) = &self.client {
            return Ok(reply::refused(reply::NOT_CONFIGURED, not_configured(problem)).into());
        }
        // The hints of a tool's errors depend on the tool (a read can always be repeated).
        let tool = request.name.to_string();
        let call = ToolCallContext::new(self, request, context);
        let response = reply::for_tool(&tool, self.tool_router.call(call)).await?;
        Ok(match response {
            // rmcp answers arguments that do not fit the tool's schema itself, with a bare
            // text; it gets the shape of every other refusal, typed `InvalidArgument`.
            CallToolResponse::Complete(r)
                if r.is_error == Some(true) && r.structured_content.is_none() =>
            {
                let text: Vec<&str> = r
                    .content
                    .iter()
                    .filter_map(|c| c.as_text())
                    .map(|t| t.text.as_str())
                    .collect();
                reply::refused(reply::INVALID_ARGUMENT, text.join(" ")).into()
            }
            other => other,
        })
    }
}

/// Serves MCP on stdin/stdout until the host closes stdin. `client` is the configured client,
/// or the configuration's problem, which every tool call then reports (see [`NokvMcp`]).
pub async fn run(client: Result<Client, ClientError>, args: McpArgs) -> Result<(), ClientError> {
    let mcp = |e: String| ClientError::local(format!("MCP: {e}"));
    let service = NokvMcp::new(client, args)?
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| mcp(e.to_string()))?;
    service.waiting().await.map_err(|e| mcp(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests;
