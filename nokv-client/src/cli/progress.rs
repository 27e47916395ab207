//! A progress bar (bytes, rate, ETA) on a terminal, nothing otherwise: not with `--quiet`,
//! not with `--json`, not when stderr is a pipe or a file.

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use nokv_client::publish::Progress;

pub struct Bar(Option<ProgressBar>);

impl Bar {
    pub fn new(total: u64, quiet: bool, json: bool, verb: &str) -> Bar {
        if quiet || json || !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message(verb.to_string());
        Bar(Some(bar))
    }

    /// The callback the SDK calls with each block's byte count.
    pub fn callback(&self) -> Option<Progress> {
        let bar = self.0.clone()?;
        Some(Arc::new(move |n| bar.inc(n)))
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
