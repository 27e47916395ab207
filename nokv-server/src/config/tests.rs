//! Tests of the configuration module: layering and precedence, defaults, and every refusal.

use std::path::Path;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use super::*;
use crate::control::access::EtcdAccessFiles;

#[test]
fn flags_win_over_the_file_and_the_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:9\"\nshards = 4\nupload_lease = \"30s\"\n",
    )
    .unwrap();
    let cli = Cli::parse_from([
        "nokv-server",
        "--config",
        file.to_str().unwrap(),
        "--shards",
        "8",
    ]);
    let s = cli.serve.resolve().unwrap();
    assert_eq!(s.shards, 8);
    assert_eq!(s.listen, "127.0.0.1:9");
    assert_eq!(s.shard.upload_lease, Duration::from_secs(30));
    assert_eq!(s.shard.inline_max, 256 * 1024);
}

#[test]
fn retired_revisions_stay_readable_for_ten_minutes_unless_configured() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.shard.retired_grace, Duration::from_secs(600));
    let s = Cli::parse_from(["nokv-server", "--retired-grace", "90s"])
        .serve
        .resolve()
        .unwrap();
    assert_eq!(s.shard.retired_grace, Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "retired_grace = \"1h\"\n").unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    assert_eq!(
        cli.serve.resolve().unwrap().shard.retired_grace,
        Duration::from_secs(3600)
    );
}

#[test]
fn metrics_are_served_only_when_metrics_listen_is_set_by_flag_or_file_and_never_on_an_empty_address()
 {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.metrics_listen, None);
    let s = Cli::parse_from(["nokv-server", "--metrics-listen", "127.0.0.1:9464"])
        .serve
        .resolve()
        .unwrap();
    assert_eq!(s.metrics_listen.as_deref(), Some("127.0.0.1:9464"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "metrics_listen = \"[::1]:9464\"\n").unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    assert_eq!(
        cli.serve.resolve().unwrap().metrics_listen.as_deref(),
        Some("[::1]:9464")
    );
    let cli = Cli::parse_from(["nokv-server", "--metrics-listen", " "]);
    assert!(cli.serve.resolve().is_err());
}

#[test]
fn log_format_is_text_unless_json_is_asked_for_by_flag_or_file_and_anything_else_is_refused() {
    use crate::logging::LogFormat;
    assert_eq!(resolve(&[]).unwrap().log_format, LogFormat::Text);
    assert_eq!(
        resolve(&["--log-format", "json"]).unwrap().log_format,
        LogFormat::Json
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "log_format = \"json\"\n").unwrap();
    let from_file = resolve(&["--config", file.to_str().unwrap()]).unwrap();
    assert_eq!(from_file.log_format, LogFormat::Json);
    let flag_wins = resolve(&["--config", file.to_str().unwrap(), "--log-format", "text"]);
    assert_eq!(flag_wins.unwrap().log_format, LogFormat::Text);
    let err = resolve(&["--log-format", "xml"]).unwrap_err();
    assert!(err.0.contains("text or json"), "{}", err.0);
}

#[test]
fn async_workers_default_to_one_per_cpu_and_zero_workers_is_refused() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(resolve(&[]).unwrap().worker_threads, cpus);
    assert_eq!(
        resolve(&["--worker-threads", "3"]).unwrap().worker_threads,
        3
    );
    assert!(resolve(&["--worker-threads", "0"]).is_err());
}

#[test]
fn the_shipped_example_configuration_parses() {
    let example = include_str!("../../../deploy/nokv-server.example.toml");
    let args: ServeArgs = toml::from_str(example).unwrap();
    assert_eq!(args.provider.as_deref(), Some("s3"));
    assert_eq!(args.bulk_parallel, Some(2));
}

#[test]
fn unknown_file_keys_and_bad_providers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "listne = \"x\"\n").unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    assert!(cli.serve.resolve().is_err());
    let cli = Cli::parse_from(["nokv-server", "--provider", "ftp"]);
    assert!(cli.serve.resolve().is_err());
    let cli = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=-1"]);
    assert!(cli.serve.resolve().is_err());
}

#[test]
fn bulk_bandwidth_has_no_cap_unless_one_is_asked_for() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.bulk_mib_per_s, None);
    let s = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=0"])
        .serve
        .resolve()
        .unwrap();
    assert_eq!(s.bulk_mib_per_s, None);
    let s = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=48"])
        .serve
        .resolve()
        .unwrap();
    assert_eq!(s.bulk_mib_per_s, Some(48.0));
}

#[test]
fn the_block_memory_budget_comes_from_flag_file_or_default_and_must_hold_one_block() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.block_memory, 256 * 1024 * 1024);
    assert_eq!(s.block_memory_wait, Duration::from_secs(10));
    let s = Cli::parse_from([
        "nokv-server",
        "--block-memory",
        "1GiB",
        "--block-memory-wait",
        "2s",
    ])
    .serve
    .resolve()
    .unwrap();
    assert_eq!(s.block_memory, 1 << 30);
    assert_eq!(s.block_memory_wait, Duration::from_secs(2));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "block_memory = \"64MiB\"\n").unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    assert_eq!(cli.serve.resolve().unwrap().block_memory, 64 << 20);
    for bad in ["1MiB", "lots", "0"] {
        let cli = Cli::parse_from(["nokv-server", "--block-memory", bad]);
        assert!(cli.serve.resolve().is_err(), "{bad}");
    }
}

#[test]
fn an_inline_max_larger_than_the_transport_carries_is_refused_at_start_up() {
    let too_big = (MAX_INLINE_MAX + 1).to_string();
    let cli = Cli::parse_from(["nokv-server", "--inline-max", too_big.as_str()]);
    let e = cli.serve.resolve().unwrap_err();
    assert!(e.0.contains("inline_max"), "{e}");
    let max = MAX_INLINE_MAX.to_string();
    let cli = Cli::parse_from(["nokv-server", "--inline-max", max.as_str()]);
    assert_eq!(
        cli.serve.resolve().unwrap().shard.inline_max,
        MAX_INLINE_MAX
    );
}

#[test]
fn reconciler_cadence_and_scan_budget_come_from_flags_or_defaults_and_zero_is_refused() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.reconcile_interval, Duration::from_secs(20));
    assert_eq!(s.shard.scan_budget, Duration::from_secs(5));
    let s = Cli::parse_from([
        "nokv-server",
        "--reconcile-interval",
        "2s",
        "--scan-budget",
        "500ms",
    ])
    .serve
    .resolve()
    .unwrap();
    assert_eq!(s.reconcile_interval, Duration::from_secs(2));
    assert_eq!(s.shard.scan_budget, Duration::from_millis(500));
    for bad in [["--reconcile-interval", "0s"], ["--scan-budget", "0s"]] {
        let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
        assert!(cli.serve.resolve().is_err(), "{bad:?}");
    }
}

/// Mutation: drop the second `layer!` (TOML ignored) or the zero check.
#[test]
fn admission_caps_default_to_8000_and_800_come_from_flags_or_toml_and_zero_is_refused() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    let caps = &s.shard.admission;
    assert_eq!(
        (
            caps.max_unresolved_uploads,
            caps.max_unresolved_uploads_per_workspace
        ),
        (8000, 800)
    );
    let s = Cli::parse_from([
        "nokv-server",
        "--max-unresolved-uploads",
        "50",
        "--max-unresolved-uploads-per-workspace",
        "5",
    ])
    .serve
    .resolve()
    .unwrap();
    let caps = &s.shard.admission;
    assert_eq!(
        (
            caps.max_unresolved_uploads,
            caps.max_unresolved_uploads_per_workspace
        ),
        (50, 5)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nokv.toml");
    std::fs::write(&file, "max_unresolved_uploads_per_workspace = 7\n").unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    let s = cli.serve.resolve().unwrap();
    assert_eq!(s.shard.admission.max_unresolved_uploads_per_workspace, 7);
    for bad in [
        ["--max-unresolved-uploads", "0"],
        ["--max-unresolved-uploads-per-workspace", "0"],
    ] {
        let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
        assert!(cli.serve.resolve().is_err(), "{bad:?}");
    }
}

#[test]
fn the_inventory_scans_hourly_by_default_and_off_or_zero_disables_periodic_scans() {
    let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
    assert_eq!(s.inventory.interval, Some(Duration::from_secs(3600)));
    assert_eq!(s.inventory.retention, Duration::from_secs(30 * 86400));
    assert_eq!(s.inventory.page, crate::inventory::DEFAULT_PAGE);
    for off in ["off", "0", "0s"] {
        let cli = Cli::parse_from(["nokv-server", "--inventory-interval", off]);
        assert_eq!(
            cli.serve.resolve().unwrap().inventory.interval,
            None,
            "{off}"
        );
    }
    let s = Cli::parse_from([
        "nokv-server",
        "--inventory-interval",
        "10m",
        "--history-retention",
        "7d",
        "--inventory-page-size",
        "3",
    ])
    .serve
    .resolve()
    .unwrap();
    assert_eq!(s.inventory.interval, Some(Duration::from_secs(600)));
    assert_eq!(s.inventory.retention, Duration::from_secs(7 * 86400));
    assert_eq!(s.inventory.page, 3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nokv.toml");
    std::fs::write(
        &file,
        "inventory_interval = \"off\"\nhistory_retention = \"1d\"\n",
    )
    .unwrap();
    let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
    let s = cli.serve.resolve().unwrap();
    assert_eq!(s.inventory.interval, None);
    assert_eq!(s.inventory.retention, Duration::from_secs(86400));
    for bad in [
        ["--inventory-interval", "soon"],
        ["--inventory-page-size", "0"],
    ] {
        let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
        assert!(cli.serve.resolve().is_err(), "{bad:?}");
    }
}

fn resolve(args: &[&str]) -> Result<Settings, ConfigError> {
    Cli::parse_from(std::iter::once("nokv-server").chain(args.iter().copied()))
        .serve
        .resolve()
}

const FULL: [&str; 10] = [
    "--etcd",
    "http://127.0.0.1:2379, http://127.0.0.1:2479",
    "--cluster",
    "prod",
    "--node-id",
    "n1",
    "--advertise",
    "n1:7878",
    "--tls-dir",
    "/c",
];

#[test]
fn without_etcd_there_are_no_cluster_settings() {
    let s = resolve(&[]).unwrap();
    assert!(s.cluster.is_none() && s.tls_dir.is_none() && s.node_id.is_none());
    let s = resolve(&["--tls-dir", "/c", "--advertise", "n1"]).unwrap();
    assert!(s.cluster.is_none());
    assert_eq!(s.tls_dir.as_deref(), Some(std::path::Path::new("/c")));
}

#[test]
fn etcd_with_every_cluster_flag_yields_cluster_settings_with_a_ten_second_node_ttl() {
    let c = resolve(&FULL).unwrap().cluster.unwrap();
    assert_eq!(
        c,
        ClusterSettings {
            etcd: vec![
                "http://127.0.0.1:2379".into(),
                "http://127.0.0.1:2479".into()
            ],
            cluster: "prod".into(),
            node_id: "n1".into(),
            advertise: "n1:7878".into(),
            node_ttl: Duration::from_secs(10),
            tls_dir: "/c".into(),
            etcd_access: EtcdAccessFiles::default(),
        }
    );
    let mut args = FULL.to_vec();
    args.extend(["--node-ttl", "3s"]);
    let c = resolve(&args).unwrap().cluster.unwrap();
    assert_eq!(c.node_ttl, Duration::from_secs(3));
}

#[test]
fn cluster_flags_come_from_the_toml_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "etcd = \"http://e:2379\"\ncluster = \"k\"\nnode_id = \"n2\"\nadvertise = \"n2\"\n\
         tls_dir = \"/c\"\nnode_ttl = \"6s\"\n",
    )
    .unwrap();
    let c = resolve(&["--config", file.to_str().unwrap()])
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(c.etcd, ["http://e:2379"]);
    assert_eq!((c.cluster.as_str(), c.node_id.as_str()), ("k", "n2"));
    assert_eq!(c.node_ttl, Duration::from_secs(6));
}

#[test]
fn etcd_without_tls_dir_is_refused_in_one_line() {
    let e = resolve(&FULL[..8]).unwrap_err();
    assert_eq!(e.0, ETCD_NEEDS_TLS_DIR);
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn etcd_without_cluster_node_id_or_advertise_is_refused_naming_what_is_missing() {
    let e = resolve(&["--etcd", "http://e:2379", "--tls-dir", "/c"]).unwrap_err();
    for flag in ["--cluster", "--node-id", "--advertise"] {
        assert!(e.0.contains(flag), "{e}");
    }
    assert!(!e.0.contains('\n'));
    let e = resolve(&[
        "--etcd",
        "http://e:2379",
        "--tls-dir",
        "/c",
        "--cluster",
        "k",
        "--advertise",
        "h",
    ])
    .unwrap_err();
    assert!(
        e.0.contains("--node-id") && !e.0.contains("--cluster NAME"),
        "{e}"
    );
}

#[test]
fn bad_cluster_values_are_refused() {
    let with = |flag: &'static str, value: &'static str| {
        let mut args = FULL.to_vec();
        args.extend([flag, value]);
        args
    };
    for args in [
        with("--node-ttl", "0s"),
        with("--node-ttl", "1500ms"),
        with("--node-ttl", "soon"),
    ] {
        assert!(resolve(&args).is_err(), "{args:?}");
    }
    let mut bad_id = FULL.to_vec();
    bad_id[5] = "n/1";
    assert!(resolve(&bad_id).is_err());
    let mut bad_url = FULL.to_vec();
    bad_url[1] = "127.0.0.1:2379";
    assert!(resolve(&bad_url).is_err());
    let mut no_url = FULL.to_vec();
    no_url[1] = " , ";
    assert!(resolve(&no_url).is_err());
}

fn https_full() -> Vec<&'static str> {
    let mut args = FULL.to_vec();
    args[1] = "https://127.0.0.1:2379,https://127.0.0.1:2479";
    args
}

#[test]
fn etcd_tls_and_credentials_come_from_flags_environment_names_and_the_toml_file() {
    let mut args = https_full();
    args.extend([
        "--etcd-ca",
        "/c/ca.pem",
        "--etcd-cert",
        "/c/etcd/client.pem",
        "--etcd-key",
        "/c/etcd/client.key",
        "--etcd-user",
        "nokv",
        "--etcd-password-file",
        "/run/pw",
    ]);
    let c = resolve(&args).unwrap().cluster.unwrap();
    assert_eq!(
        c.etcd_access,
        EtcdAccessFiles {
            ca: Some("/c/ca.pem".into()),
            cert: Some("/c/etcd/client.pem".into()),
            key: Some("/c/etcd/client.key".into()),
            user: Some("nokv".into()),
            password_file: Some("/run/pw".into()),
        }
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "etcd = \"https://e:2379\"\ncluster = \"k\"\nnode_id = \"n2\"\nadvertise = \"n2\"\n\
         tls_dir = \"/c\"\netcd_ca = \"/c/ca.pem\"\netcd_cert = \"/c/e.pem\"\n\
         etcd_key = \"/c/e.key\"\netcd_user = \"u\"\netcd_password_file = \"/pw\"\n",
    )
    .unwrap();
    let c = resolve(&["--config", file.to_str().unwrap()])
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(c.etcd_access.key.as_deref(), Some(Path::new("/c/e.key")));
    assert_eq!(c.etcd_access.user.as_deref(), Some("u"));
    let help = Cli::command().render_long_help().to_string();
    for env in [
        "NOKV_ETCD_CA",
        "NOKV_ETCD_CERT",
        "NOKV_ETCD_KEY",
        "NOKV_ETCD_USER",
        "NOKV_ETCD_PASSWORD_FILE",
    ] {
        assert!(help.contains(env), "{env}");
    }
}

#[test]
fn etcd_access_flags_that_do_not_fit_the_urls_or_each_other_are_refused_in_one_line() {
    let with = |base: Vec<&'static str>, extra: &[&'static str]| {
        let mut args = base;
        args.extend_from_slice(extra);
        resolve(&args).map(|_| ()).map_err(|e| e.0)
    };
    let ca = ["--etcd-ca", "/ca.pem"];
    let cases: [(Vec<&'static str>, Vec<&'static str>, &str); 7] = [
        (https_full(), vec![], "needs --etcd-ca"),
        (FULL.to_vec(), ca.to_vec(), "--etcd-ca needs https://"),
        (
            https_full(),
            [&ca[..], &["--etcd-cert", "/c.pem"]].concat(),
            "--etcd-cert needs --etcd-key",
        ),
        (
            https_full(),
            [&ca[..], &["--etcd-key", "/c.key"]].concat(),
            "--etcd-key needs --etcd-cert",
        ),
        (
            FULL.to_vec(),
            vec!["--etcd-user", "u"],
            "--etcd-user needs --etcd-password-file",
        ),
        (
            FULL.to_vec(),
            vec!["--etcd-password-file", "/pw"],
            "--etcd-password-file needs --etcd-user",
        ),
        (
            {
                let mut a = FULL.to_vec();
                a[1] = "http://a:2379,https://b:2379";
                a
            },
            vec![],
            "mixes",
        ),
    ];
    for (base, extra, expected) in cases {
        let e = with(base, &extra).unwrap_err();
        assert!(e.contains(expected), "{extra:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    assert!(with(https_full(), &ca).is_ok());
    let e = resolve(&["--etcd-ca", "/ca.pem"]).unwrap_err();
    assert!(e.0.contains("only apply with --etcd"), "{e}");
}

#[test]
fn cluster_only_flags_without_etcd_are_refused() {
    assert!(resolve(&["--cluster", "k"]).is_err());
    assert!(resolve(&["--node-ttl", "5s"]).is_err());
}

#[test]
fn tls_dir_needs_a_host_or_node_id_to_choose_its_certificate() {
    let e = resolve(&["--tls-dir", "/c"]).unwrap_err();
    assert!(e.0.contains("--advertise"), "{e}");
    assert!(resolve(&["--tls-dir", "/c", "--node-id", "n1"]).is_ok());
}

#[test]
fn metadata_durability_is_local_on_the_embedded_default_and_provider_in_a_cluster() {
    let s = resolve(&[]).unwrap();
    assert_eq!(s.durability.mode, DurabilityMode::Local);
    assert_eq!(s.durability.log_flush_interval, Duration::ZERO);
    assert_eq!(
        s.durability.checkpoint_interval,
        DEFAULT_CHECKPOINT_INTERVAL
    );
    assert_eq!(
        resolve(&FULL).unwrap().durability.mode,
        DurabilityMode::Provider
    );
    let mut args = FULL.to_vec();
    args.extend(["--metadata-durability", "local"]);
    assert_eq!(
        resolve(&args).unwrap().durability.mode,
        DurabilityMode::Local
    );
    let d = resolve(&[
        "--metadata-durability",
        "provider",
        "--log-flush-interval",
        "5ms",
        "--checkpoint-interval",
        "1m",
    ])
    .unwrap()
    .durability;
    assert_eq!(
        (d.mode, d.log_flush_interval, d.checkpoint_interval),
        (
            DurabilityMode::Provider,
            Duration::from_millis(5),
            Duration::from_secs(60)
        )
    );
}

#[test]
fn metadata_durability_comes_from_the_toml_file_and_bad_values_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "metadata_durability = \"provider\"\nlog_flush_interval = \"2ms\"\n",
    )
    .unwrap();
    let d = resolve(&["--config", file.to_str().unwrap()])
        .unwrap()
        .durability;
    assert_eq!(
        (d.mode, d.log_flush_interval),
        (DurabilityMode::Provider, Duration::from_millis(2))
    );
    for (flag, value) in [
        ("--metadata-durability", "disk"),
        ("--log-flush-interval", "2s"),
        ("--log-flush-interval", "soon"),
        ("--checkpoint-interval", "0s"),
    ] {
        let e = resolve(&[flag, value]).unwrap_err();
        assert!(e.0.contains(flag), "{flag} {value}: {}", e.0);
        assert!(!e.0.contains('\n'));
    }
}
