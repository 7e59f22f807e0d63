//! Fuzz target bodies, shared by the cargo-fuzz crate (`fuzz/`, nightly, millions of inputs) and
//! the bounded run in the test suite (`tests/tests/fuzz_smoke.rs`, stable, seed corpus plus
//! deterministic mutations).
//!
//! Each body takes arbitrary bytes, feeds them to one parser that faces untrusted input, and
//! panics when something that must hold does not: beyond "no panic", a value that parses must
//! survive its own way back out (a spec re-serialized as JSON and as YAML, a selector's canonical
//! text, a protobuf message converted to the domain and back). See `docs/security.md (Fuzzing the parsers that face untrusted input)`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use meridian_gateway::tls::identity::{CLUSTER_URI_PREFIX, clusters_named};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand};
use meridian_proto::selector::{Operator, Selector};
use meridian_proto::spec::JobSpec;
use meridian_proto::validate::{SpecError, parse_job_spec};
use prost::Message;

/// One fuzz target: its name (the cargo-fuzz target and the seed directory) and its body.
#[derive(Clone, Copy)]
pub struct Target {
    /// `cargo fuzz run NAME`; seeds live in `fuzz/seeds/NAME/`.
    pub name: &'static str,
    /// Panics when an invariant breaks; returns whether the input was accepted (and so its round
    /// trip checked), which tells a bounded run whether it reached past the error paths.
    pub body: fn(&[u8]) -> bool,
}

/// Every target, in the order the script runs them.
pub const TARGETS: &[Target] = &[
    Target { name: "job_spec", body: job_spec },
    Target { name: "selector", body: selector },
    Target { name: "agent_message", body: agent_message },
    Target { name: "gateway_message", body: gateway_message },
    Target { name: "certificate_san", body: certificate_san },
    Target { name: "rest_query", body: rest_query },
];

/// The job-spec parser (YAML and JSON) with the default GPU catalog. A spec that parses
/// re-serializes as JSON and as YAML, and both parse back to the same spec; a refusal names at
/// least one field.
pub fn job_spec(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    let catalog = GpuCatalog::default();
    match parse_job_spec(text, &catalog) {
        Ok(spec) => {
            let json = serde_json::to_string(&spec).unwrap_or_else(|e| panic!("a parsed spec must serialize: {e}"));
            assert_same(&spec, &reparse(&json, &catalog), "spec → JSON → spec");
            let yaml = serde_saphyr::to_string(&spec).unwrap_or_else(|e| panic!("a parsed spec must serialize: {e}"));
            assert_same(&spec, &reparse(&yaml, &catalog), "spec → YAML → spec");
            true
        }
        Err(error) => {
            let fields = error.field_errors();
            assert!(!fields.is_empty(), "a refusal names no field: {error:?}");
            assert!(fields.iter().all(|f| !f.field.is_empty()), "a refusal has an empty field path: {error:?}");
            false
        }
    }
}

fn reparse(text: &str, catalog: &GpuCatalog) -> JobSpec {
    parse_job_spec(text, catalog)
        .unwrap_or_else(|e: SpecError| panic!("a parsed spec, re-serialized, is refused: {e}\n--- text ---\n{text}"))
}

/// The REST query decoding (`GET /v1/jobs?...`, `GET /v1/jobs/{id}/logs?...`) and the list and
/// logs parameters read from it. A query that decodes has each parameter once, and encoding its
/// parameters again decodes to the same ones; every refusal is a 400 naming a parameter.
pub fn rest_query(data: &[u8]) -> bool {
    use std::collections::HashMap;

    use meridian_gateway::api::ApiError;
    use meridian_gateway::api::query::decode_query;
    use meridian_gateway::api::rest::{parse_list_query, parse_logs_query};

    let names_a_field = |error: &ApiError| {
        assert!(
            matches!(error, ApiError::BadRequest { field, .. } if !field.is_empty()),
            "a refused query names no parameter: {error:?}"
        );
    };
    let Ok(text) = std::str::from_utf8(data) else { return false };
    let params = match decode_query(text) {
        Ok(params) => params,
        Err(error) => {
            names_a_field(&error);
            return false;
        }
    };
    let mut seen = std::collections::HashSet::new();
    assert!(params.iter().all(|(name, _)| seen.insert(name.as_str())), "a parameter decoded twice: {params:?}");
    let encoded: Vec<String> = params
        .iter()
        .map(|(name, value)| {
            format!("{}={}", meridian_cli::client::percent_encode(name), meridian_cli::client::percent_encode(value))
        })
        .collect();
    let again = decode_query(&encoded.join("&")).unwrap_or_else(|e| panic!("re-encoded {params:?} is refused: {e}"));
    // Empty segments (`a=1&&b=2`) and bare names are dropped or kept alike on both sides, except
    // that an empty name with an empty value encodes to `=`; compare what both keep.
    assert_eq!(again, params, "encode → decode changed the parameters");
    let map: HashMap<String, String> = params.into_iter().collect();
    let list = parse_list_query(&map);
    if let Err(error) = &list {
        names_a_field(error);
    }
    if let Err(error) = parse_logs_query(&map) {
        names_a_field(&error);
    }
    list.is_ok()
}

/// The label-selector parser (`?selector=`, `meridian jobs -l`, placement selectors). A selector
/// that parses prints as canonical text that parses back to an equal selector (and prints the
/// same again), and matches the labels it requires; a refusal points at an existing requirement.
pub fn selector(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    match text.parse::<Selector>() {
        Ok(selector) => {
            let canonical = selector.to_string();
            let again: Selector =
                canonical.parse().unwrap_or_else(|e| panic!("canonical text `{canonical}` is refused: {e}"));
            assert_eq!(again, selector, "`{text}` → `{canonical}` parses to another selector");
            assert_eq!(again.to_string(), canonical, "canonical text is not stable");
            // Two requirements may contradict each other (`a,!a`); one alone never does: it is
            // met by the labels it asks for, and the whole selector by a map and a lookup alike.
            for requirement in selector.requirements() {
                let key = requirement.key().to_string();
                let labels: BTreeMap<String, String> = match (requirement.operator(), requirement.value()) {
                    (Operator::Equals, Some(value)) => BTreeMap::from([(key, value.to_string())]),
                    (Operator::Exists, _) => BTreeMap::from([(key, String::new())]),
                    _ => BTreeMap::new(),
                };
                assert!(requirement.matches(&labels), "`{requirement}` is not met by {labels:?}");
                let by_lookup = selector.matches_by(|k| labels.get(k).map(String::as_str));
                assert_eq!(selector.matches(&labels), by_lookup, "`{selector}` matches a map and a lookup differently");
            }
            true
        }
        Err(error) => {
            let requirements = text.split(',').count();
            assert!(
                (1..=requirements).contains(&error.position),
                "error position {} outside 1..={requirements}: {error}",
                error.position
            );
            false
        }
    }
}

/// An agent's message as the gateway receives it: protobuf bytes decoded as `pb::AgentMessage`,
/// then converted to the domain (`AgentHello` for a hello, `Option<AgentEvent>` otherwise). What
/// converts, converted back to the wire and again to the domain, is the same value.
pub fn agent_message(data: &[u8]) -> bool {
    let Ok(message) = pb::AgentMessage::decode(data) else { return false };
    let mut accepted = false;
    if let Some(pb::agent_message::Body::Hello(hello)) = &message.body
        && let Ok(hello) = AgentHello::try_from(hello.clone())
    {
        let wire = reencode(&pb::Hello::from(&hello));
        let again = AgentHello::try_from(wire).unwrap_or_else(|e| panic!("{hello:?} does not survive the wire: {e}"));
        assert_same(&hello, &again, "hello → wire → hello");
        accepted = true;
    }
    if let Ok(Some(event)) = Option::<AgentEvent>::try_from(message) {
        let wire = reencode(&pb::AgentMessage::from(&event));
        let again = Option::<AgentEvent>::try_from(wire)
            .unwrap_or_else(|e| panic!("{event:?} does not survive the wire: {e}"))
            .unwrap_or_else(|| panic!("{event:?} came back as a hello"));
        assert_same(&event, &again, "event → wire → event");
        accepted = true;
    }
    accepted
}

/// A gateway's message as the agent receives it (`member-agent`'s link converts every message
/// with `GatewayCommand::try_from`). What converts survives the wire and back.
pub fn gateway_message(data: &[u8]) -> bool {
    let Ok(message) = pb::GatewayMessage::decode(data) else { return false };
    let Ok(command) = GatewayCommand::try_from(message) else { return false };
    let wire = reencode(&pb::GatewayMessage::from(&command));
    let again = GatewayCommand::try_from(wire).unwrap_or_else(|e| panic!("{command:?} does not survive the wire: {e}"));
    assert_same(&command, &again, "command → wire → command");
    true
}

/// The gateway's reader of the cluster an agent certificate names. On arbitrary bytes it returns
/// only non-empty names whose URI is in the input; on a certificate-shaped structure built from
/// the input (cluster URIs, other URIs and DNS names, any lengths) it returns exactly the
/// cluster names, in order.
pub fn certificate_san(data: &[u8]) -> bool {
    let named = clusters_named(data);
    let mut accepted = !named.is_empty();
    for name in named {
        assert!(!name.is_empty(), "an empty cluster name");
        let uri = format!("{CLUSTER_URI_PREFIX}{name}");
        assert!(contains(data, uri.as_bytes()), "`{uri}` is not in the input");
    }

    // Each NUL-separated chunk is one general name: its first byte picks a cluster URI, another
    // URI (which names a cluster too if it happens to start with the prefix) or a DNS name.
    let mut expected = Vec::new();
    let mut general_names = Vec::new();
    for chunk in data.split(|&b| b == 0) {
        let Some((&kind, rest)) = chunk.split_first() else { continue };
        let text = String::from_utf8_lossy(rest);
        let uri = match kind % 3 {
            0 => format!("{CLUSTER_URI_PREFIX}{text}"),
            1 => text.into_owned(),
            _ => {
                general_names.extend(der(0x82, rest));
                continue;
            }
        };
        if let Some(name) = uri.strip_prefix(CLUSTER_URI_PREFIX).filter(|name| !name.is_empty()) {
            expected.push(name.to_string());
        }
        general_names.extend(der(0x86, uri.as_bytes()));
    }
    let certificate = certificate_with_general_names(&general_names);
    assert_eq!(clusters_named(&certificate), expected, "names read from a well-formed certificate");
    accepted |= !expected.is_empty();
    accepted
}

/// One DER TLV with a definite length (short or long form).
fn der(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = value.len();
    if length < 0x80 {
        out.push(length as u8);
    } else {
        let bytes: Vec<u8> = length.to_be_bytes().into_iter().skip_while(|&b| b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(value);
    out
}

/// The skeleton of an X.509 certificate with one extension, subjectAltName, holding
/// `general_names` (already DER), and another extension before it.
fn certificate_with_general_names(general_names: &[u8]) -> Vec<u8> {
    let san = [der(0x06, &[0x55, 0x1d, 0x11]), der(0x04, &der(0x30, general_names))].concat();
    let basic_constraints = [der(0x06, &[0x55, 0x1d, 0x13]), der(0x01, &[0xff]), der(0x04, &der(0x30, &[]))].concat();
    let extensions = der(0xa3, &der(0x30, &[der(0x30, &basic_constraints), der(0x30, &san)].concat()));
    let tbs = [
        der(0xa0, &der(0x02, &[2])),
        der(0x02, &[1]),
        der(0x30, &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02])),
        extensions,
    ]
    .concat();
    der(0x30, &[der(0x30, &tbs), der(0x30, &[]), der(0x03, &[0])].concat())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|window| window == needle)
}

/// Encodes and decodes again, so the round trip goes through real bytes.
fn reencode<M: Message + Default>(message: &M) -> M {
    M::decode(message.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("our own encoding does not decode: {e}"))
}

/// Equal, or (for values holding a NaN, which the wire conversions carry as they come) printing
/// the same.
fn assert_same<T: PartialEq + Debug>(before: &T, after: &T, what: &str) {
    if before != after {
        let (a, b) = (format!("{before:?}"), format!("{after:?}"));
        assert_eq!(a, b, "{what} changed the value");
    }
}

// ---------------------------------------------------------------- bounded runs on stable

/// The checked-in seed corpus of `target`: `fuzz/seeds/TARGET/*`, sorted by file name.
pub fn seeds(target: &str) -> std::io::Result<Vec<Vec<u8>>> {
    let dir = seed_dir(target);
    let mut paths: Vec<PathBuf> =
        std::fs::read_dir(&dir)?.map(|entry| entry.map(|e| e.path())).collect::<std::io::Result<_>>()?;
    paths.sort();
    paths.iter().map(std::fs::read).collect()
}

/// `fuzz/seeds/TARGET` in this repository.
pub fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target)
}

/// A small deterministic random source (SplitMix64), so a bounded run is the same run every time.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: usize) -> usize {
        if bound == 0 { 0 } else { (self.next_u64() % bound as u64) as usize }
    }
}

/// Bytes that often matter to the parsers above: YAML and JSON structure, selector operators,
/// protobuf varints and length prefixes, DER lengths.
const TOKENS: &[&[u8]] = &[
    b":",
    b"\n",
    b"- ",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"\"",
    b"'",
    b"=",
    b"!=",
    b"==",
    b"!",
    b" ",
    b"/",
    b"&a",
    b"*a",
    b"!!str ",
    b"~",
    b"null",
    b"1e400",
    b"-1",
    b"18446744073709551616",
    b"NaN",
    b".inf",
    b"0x",
    b"\\u0000",
    b"\xff\xff\xff\xff\x0f",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x0a\x7f",
    b"\x84\xff\xff\xff\xff",
    b"\x81\x80",
    b"urn:meridian:cluster:",
    "é".as_bytes(),
];

/// One mutation of `input`: a bit flip, a random byte, an inserted token or random bytes, a
/// deleted or duplicated range, a truncation, or a splice with another corpus entry.
pub fn mutate(input: &[u8], corpus: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    // Mostly one change: a parser refuses most inputs with several, and refusals test little.
    let rounds = if rng.below(4) == 0 { 2 + rng.below(3) } else { 1 };
    for _ in 0..rounds {
        let len = out.len();
        match rng.below(8) {
            0 if len > 0 => {
                let at = rng.below(len);
                out[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                out[at] = rng.next_u64() as u8;
            }
            2 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                let at = rng.below(len + 1);
                out.splice(at..at, token.iter().copied());
            }
            3 => {
                let at = rng.below(len + 1);
                let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next_u64() as u8).collect();
                out.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = start + 1 + rng.below((len - start).min(16));
                out.drain(start..end);
            }
            5 if len > 0 => {
                let start = rng.below(len);
                let end = start + 1 + rng.below((len - start).min(32));
                let copy = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, copy);
            }
            6 if len > 0 => out.truncate(rng.below(len)),
            _ if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    out
}

/// What a bounded run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunStats {
    /// Inputs run (seeds and mutants).
    pub inputs: usize,
    /// Mutants the parser accepted, whose round trip was therefore checked.
    pub accepted_mutants: usize,
}

/// Runs `target` over its seeds and `mutations` deterministic mutations of them (seeded with
/// `seed`). Panics, like the fuzzer, on the first broken invariant, after printing the input.
pub fn bounded_run(target: &Target, seeds: &[Vec<u8>], mutations: usize, seed: u64) -> RunStats {
    let run = |input: &[u8]| match std::panic::catch_unwind(|| (target.body)(input)) {
        Ok(accepted) => accepted,
        Err(panic) => {
            eprintln!("{}: failing input ({} bytes): {:?}", target.name, input.len(), String::from_utf8_lossy(input));
            eprintln!("{}: as bytes: {input:?}", target.name);
            std::panic::resume_unwind(panic);
        }
    };
    for input in seeds {
        run(input);
    }
    let mut accepted_mutants = 0;
    let mut rng = Rng::new(seed);
    let mut pool: Vec<Vec<u8>> = seeds.to_vec();
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    for _ in 0..mutations {
        let base = &pool[rng.below(pool.len())];
        let input = mutate(base, &pool, &mut rng);
        let accepted = run(&input);
        accepted_mutants += usize::from(accepted);
        // Keep accepted mutants (and a few refused ones), so mutations build on each other as
        // they do in a fuzzer's corpus.
        if (accepted || rng.below(16) == 0) && pool.len() < 1024 {
            pool.push(input);
        }
    }
    RunStats { inputs: seeds.len() + mutations, accepted_mutants }
}
