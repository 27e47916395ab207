//! Generates the nokv.v1 tonic/prost code with the vendored protoc, so no system protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Bodies as `bytes::Bytes`: cloning a request for a retry, slicing a block into
        // chunks and decoding a 4 MiB block all share one buffer instead of copying it.
        .bytes(".nokv.v1.PutBlockRequest.data")
        .bytes(".nokv.v1.ReadBlockChunk.data")
        .bytes(".nokv.v1.WriteRequest.data")
        .bytes(".nokv.v1.ReadResponse.data")
        .bytes(".nokv.v1.BackupChunk.data")
        .file_descriptor_set_path(out.join("nokv_descriptor.bin"))
        .compile_protos(&["proto/nokv/v1/nokv.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
