//! The object provider: which store artifact blocks go to (`--provider local | s3 | memory`)
//! and the S3 settings, resolved into a [`ProviderConfig`].
//!
//! Invariants: the default is the local provider under `DATA_DIR/objects`; S3 credentials come
//! from the TOML file only, else from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (there is
//! no flag for them). The provider is validated here and nowhere else; the S3 key prefix (`--s3-prefix`) applies to every provider and is defaulted
//! by [`ServeArgs::resolve`].

use std::path::Path;

use super::error::ConfigError;
use super::serving::ServeArgs;
use crate::object::ProviderConfig;

/// Takes the provider settings out of `args`: the provider `data_dir`'s node serves from.
pub(super) fn provider(
    args: &mut ServeArgs,
    data_dir: &Path,
) -> Result<ProviderConfig, ConfigError> {
    Ok(match args.provider.as_deref().unwrap_or("local") {
        "local" => ProviderConfig::Local {
            root: data_dir.join("objects"),
        },
        "memory" => ProviderConfig::Memory,
        "s3" => ProviderConfig::S3 {
            endpoint: args.s3_endpoint.take(),
            bucket: args
                .s3_bucket
                .take()
                .ok_or_else(|| ConfigError("--provider s3 needs --s3-bucket".into()))?,
            region: args.s3_region.take().unwrap_or_else(|| "us-east-1".into()),
            allow_http: args.s3_allow_http.unwrap_or(false),
            access_key_id: args
                .s3_access_key_id
                .take()
                .or_else(|| std::env::var("AWS_ACCESS_KEY_ID").ok()),
            secret_access_key: args
                .s3_secret_access_key
                .take()
                .or_else(|| std::env::var("AWS_SECRET_ACCESS_KEY").ok()),
        },
        other => {
            return Err(ConfigError(format!(
                "provider {other:?} is not one of local, s3, memory"
            )));
        }
    })
}
