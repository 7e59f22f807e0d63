//! The console's files, embedded at compile time from `gateway/console/`.

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/console/`.
    pub name: &'static str,
    /// Its media type.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
    /// A hash of `body`, computed at compile time, for the `ETag`.
    hash: u64,
}

impl Asset {
    const fn new(name: &'static str, content_type: &'static str, body: &'static [u8]) -> Self {
        Self { name, content_type, body, hash: fnv1a(body) }
    }

    /// The file called `name`, if the console has one.
    pub fn find(name: &str) -> Option<&'static Asset> {
        ASSETS.iter().find(|asset| asset.name == name)
    }

    /// The entity tag of this version of the file (quoted, as HTTP writes it).
    pub fn etag(&self) -> String {
        format!("\"{:016x}\"", self.hash)
    }
}

/// Every file of the console.
pub static ASSETS: &[Asset] = &[
    Asset::new("index.html", "text/html; charset=utf-8", include_bytes!("../../../console/index.html")),
    Asset::new("app.js", "text/javascript; charset=utf-8", include_bytes!("../../../console/app.js")),
    Asset::new("style.css", "text/css; charset=utf-8", include_bytes!("../../../console/style.css")),
    Asset::new("icon.svg", "image/svg+xml", include_bytes!("../../../console/icon.svg")),
];

/// FNV-1a, 64 bits: enough to tell versions of a file apart, and computable in a `const`.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}
