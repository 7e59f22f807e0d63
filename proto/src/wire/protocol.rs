//! The agent ↔ gateway protocol on the wire: conversions between the domain messages of
//! [`crate::protocol`] and the generated `pb::AgentMessage` / `pb::GatewayMessage`.

use super::convert::{self, ConvertError, Result};
use super::pb;
use crate::inventory::{ClusterInfo, Inventory, QueuePressure};
use crate::protocol::*;
use crate::spec::JobSpec;
use std::time::Duration;

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&JobReport> for pb::JobStatus {
    fn from(report: &JobReport) -> Self {
        pb::JobStatus {
            job_id: report.job_id.clone(),
            fencing_token: report.fencing_token,
            state: pb::JobState::from(report.state).into(),
            message: report.message.clone(),
            nodes: report.nodes.clone(),
            requeue: report.requeue,
            preempted: report.preempted,
            usage: report.usage.map(|usage| pb::JobUsage {
                gpu_utilization: usage.gpu_utilization,
                window_seconds: usage.window.as_secs(),
                samples: usage.samples,
            }),
        }
    }
}

/// A job's usage from the wire: a utilisation outside 0..=1 (or not a number) is refused with
/// the field's path; a usage made of no samples means nothing and reads as unknown.
fn usage_from_wire(usage: Option<pb::JobUsage>, path: &str) -> Result<Option<GpuUsage>> {
    let Some(usage) = usage else { return Ok(None) };
    if !(0.0..=1.0).contains(&usage.gpu_utilization) {
        return Err(ConvertError::OutOfRange {
            field: format!("{path}.usage.gpu_utilization"),
            value: usage.gpu_utilization,
            expected: "a fraction from 0 to 1",
        });
    }
    if usage.samples == 0 {
        return Ok(None);
    }
    Ok(Some(GpuUsage {
        gpu_utilization: usage.gpu_utilization,
        window: Duration::from_secs(usage.window_seconds),
        samples: usage.samples,
    }))
}

fn report_from_wire(status: pb::JobStatus, path: &str) -> Result<JobReport> {
    if status.job_id.trim().is_empty() {
        return Err(ConvertError::MissingField(format!("{path}.job_id")));
    }
    Ok(JobReport {
        state: convert::job_state_from_wire(&format!("{path}.state"), status.state)?,
        usage: usage_from_wire(status.usage, path)?,
        job_id: status.job_id,
        fencing_token: status.fencing_token,
        message: status.message,
        nodes: status.nodes,
        requeue: status.requeue,
        preempted: status.preempted,
    })
}

impl TryFrom<pb::JobStatus> for JobReport {
    type Error = ConvertError;
    fn try_from(status: pb::JobStatus) -> Result<Self> {
        report_from_wire(status, "status")
    }
}

impl From<&AgentHello> for pb::Hello {
    fn from(hello: &AgentHello) -> Self {
        pb::Hello {
            instance_id: hello.instance_id.clone(),
            agent_version: hello.agent_version.clone(),
            ..pb::Hello::from(&hello.info)
        }
    }
}

impl TryFrom<pb::Hello> for AgentHello {
    type Error = ConvertError;
    fn try_from(hello: pb::Hello) -> Result<Self> {
        let instance_id = hello.instance_id.clone();
        let agent_version = hello.agent_version.clone();
        if instance_id.trim().is_empty() {
            return Err(ConvertError::MissingField("hello.instance_id".into()));
        }
        Ok(AgentHello { info: ClusterInfo::try_from(hello)?, instance_id, agent_version })
    }
}

impl From<&AgentEvent> for pb::AgentMessage {
    fn from(event: &AgentEvent) -> Self {
        use pb::agent_message::Body;
        let body = match event {
            AgentEvent::Inventory(inventory) => Body::Inventory(pb::Inventory::from(inventory)),
            AgentEvent::Pressure(pressure) => Body::Pressure(pb::QueuePressure::from(pressure)),
            AgentEvent::OfferReply { job_id, fencing_token, accepted, reason, permanent } => {
                Body::OfferReply(pb::OfferReply {
                    job_id: job_id.clone(),
                    fencing_token: *fencing_token,
                    accepted: *accepted,
                    reason: reason.clone(),
                    permanent: *permanent,
                })
            }
            AgentEvent::Status(report) => Body::Status(pb::JobStatus::from(report)),
            AgentEvent::Heartbeat { seq, jobs } => {
                Body::Heartbeat(pb::Heartbeat { seq: *seq, jobs: jobs.iter().map(pb::JobStatus::from).collect() })
            }
            AgentEvent::Logs { request_id, result } => Body::Logs(pb::LogsReply {
                request_id: *request_id,
                result: Some(match result {
                    Ok(chunk) => pb::logs_reply::Result::Chunk(pb::LogChunk {
                        data: chunk.data.clone(),
                        offset: chunk.offset,
                        next_offset: chunk.next_offset,
                        complete: chunk.complete,
                    }),
                    Err(message) => pb::logs_reply::Result::Error(message.clone()),
                }),
            }),
            AgentEvent::Quote { request_id, result } => Body::Quote(pb::QuoteReply {
                request_id: *request_id,
                result: Some(match result {
                    Ok(quote) => pb::quote_reply::Result::Quote(pb::StartQuote {
                        starts: quote
                            .starts
                            .iter()
                            .map(|s| pb::TypeStart {
                                gpu_type: s.gpu_type.clone(),
                                after_seconds: s.after_secs,
                                preempts: s.preempts,
                            })
                            .collect(),
                        basis: quote.basis.clone(),
                    }),
                    Err(message) => pb::quote_reply::Result::Error(message.clone()),
                }),
            }),
            AgentEvent::CopyReady { job_id, copy_token } => {
                Body::CopyReady(pb::CopyReady { job_id: job_id.clone(), copy_token: *copy_token })
            }
            AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported } => Body::CopyDropped(pb::CopyDropped {
                job_id: job_id.clone(),
                copy_token: *copy_token,
                reason: reason.clone(),
                unsupported: *unsupported,
            }),
        };
        pb::AgentMessage { body: Some(body) }
    }
}

/// What an agent message after the hello converts to: an event, or a repeated hello (which
/// carries nothing new and is ignored).
impl TryFrom<pb::AgentMessage> for Option<AgentEvent> {
    type Error = ConvertError;
    fn try_from(message: pb::AgentMessage) -> Result<Self> {
        use pb::agent_message::Body;
        let Some(body) = message.body else { return Err(ConvertError::MissingField("body".into())) };
        Ok(Some(match body {
            Body::Hello(_) => return Ok(None),
            Body::Inventory(inventory) => AgentEvent::Inventory(Inventory::try_from(inventory)?),
            Body::Pressure(pressure) => AgentEvent::Pressure(QueuePressure::try_from(pressure)?),
            Body::OfferReply(reply) => {
                if reply.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("offer_reply.job_id".into()));
                }
                AgentEvent::OfferReply {
                    job_id: reply.job_id,
                    fencing_token: reply.fencing_token,
                    accepted: reply.accepted,
                    reason: reply.reason,
                    permanent: reply.permanent && !reply.accepted,
                }
            }
            Body::Status(status) => AgentEvent::Status(report_from_wire(status, "status")?),
            Body::Heartbeat(heartbeat) => AgentEvent::Heartbeat {
                seq: heartbeat.seq,
                jobs: heartbeat
                    .jobs
                    .into_iter()
                    .enumerate()
                    .map(|(i, status)| report_from_wire(status, &format!("heartbeat.jobs[{i}]")))
                    .collect::<Result<_>>()?,
            },
            Body::Logs(reply) => AgentEvent::Logs {
                request_id: reply.request_id,
                result: match reply.result {
                    Some(pb::logs_reply::Result::Chunk(chunk)) => {
                        if chunk.next_offset < chunk.offset {
                            return Err(ConvertError::OutOfRange {
                                field: "logs.chunk.next_offset".into(),
                                value: chunk.next_offset as f64,
                                expected: "at least `offset`",
                            });
                        }
                        Ok(LogChunk {
                            data: chunk.data,
                            offset: chunk.offset,
                            next_offset: chunk.next_offset,
                            complete: chunk.complete,
                        })
                    }
                    Some(pb::logs_reply::Result::Error(message)) => Err(message),
                    None => return Err(ConvertError::MissingField("logs.result".into())),
                },
            },
            Body::Quote(reply) => AgentEvent::Quote {
                request_id: reply.request_id,
                result: match reply.result {
                    Some(pb::quote_reply::Result::Quote(quote)) => Ok(quote_from_wire(quote)?),
                    Some(pb::quote_reply::Result::Error(message)) => Err(message),
                    None => return Err(ConvertError::MissingField("quote.result".into())),
                },
            },
            Body::CopyReady(ready) => {
                if ready.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("copy_ready.job_id".into()));
                }
                AgentEvent::CopyReady { job_id: ready.job_id, copy_token: ready.copy_token }
            }
            Body::CopyDropped(dropped) => {
                if dropped.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("copy_dropped.job_id".into()));
                }
                AgentEvent::CopyDropped {
                    job_id: dropped.job_id,
                    copy_token: dropped.copy_token,
                    reason: dropped.reason,
                    unsupported: dropped.unsupported,
                }
            }
        }))
    }
}

fn quote_from_wire(quote: pb::StartQuote) -> Result<StartQuote> {
    let starts = quote
        .starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            if start.gpu_type.trim().is_empty() {
                return Err(ConvertError::MissingField(format!("quote.starts[{i}].gpu_type")));
            }
            Ok(TypeStart { gpu_type: start.gpu_type, after_secs: start.after_seconds, preempts: start.preempts })
        })
        .collect::<Result<_>>()?;
    Ok(StartQuote { starts, basis: quote.basis })
}

impl From<&Assignment> for pb::Offer {
    fn from(assignment: &Assignment) -> Self {
        pb::Offer {
            job_id: assignment.job_id.clone(),
            fencing_token: assignment.fencing_token,
            spec: Some(pb::JobSpec::from(&assignment.spec)),
            last_preempted_at_ms: assignment.last_preempted_at_ms,
        }
    }
}

fn assignment_from_wire(offer: pb::Offer, path: &str) -> Result<Assignment> {
    if offer.job_id.trim().is_empty() {
        return Err(ConvertError::MissingField(format!("{path}.job_id")));
    }
    let spec = offer.spec.ok_or_else(|| ConvertError::MissingField(format!("{path}.spec")))?;
    Ok(Assignment {
        job_id: offer.job_id,
        fencing_token: offer.fencing_token,
        spec: JobSpec::try_from(spec)?,
        last_preempted_at_ms: offer.last_preempted_at_ms,
    })
}

impl TryFrom<pb::Offer> for Assignment {
    type Error = ConvertError;
    fn try_from(offer: pb::Offer) -> Result<Self> {
        assignment_from_wire(offer, "offer")
    }
}

impl GatewayCommand {
    /// The command's name, for logs and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayCommand::Welcome { .. } => "welcome",
            GatewayCommand::Offer(_) => "offer",
            GatewayCommand::Cancel { .. } => "cancel",
            GatewayCommand::Ack { .. } => "ack",
            GatewayCommand::Lease { .. } => "lease",
            GatewayCommand::Logs { .. } => "logs",
            GatewayCommand::Quote { .. } => "quote",
            GatewayCommand::Copy { .. } => "copy",
            GatewayCommand::Grant { .. } => "grant",
            GatewayCommand::DropCopy { .. } => "drop_copy",
        }
    }
}

impl From<&GatewayCommand> for pb::GatewayMessage {
    fn from(command: &GatewayCommand) -> Self {
        use pb::gateway_message::Body;
        let body = match command {
            GatewayCommand::Welcome { bound, lease } => Body::Welcome(pb::Welcome {
                gateway_version: env!("CARGO_PKG_VERSION").to_string(),
                bound_jobs: bound.iter().map(pb::Offer::from).collect(),
                lease_ms: lease.map_or(0, duration_ms),
            }),
            GatewayCommand::Offer(assignment) => Body::Offer(pb::Offer::from(assignment)),
            GatewayCommand::Cancel { job_id, fencing_token } => {
                Body::Cancel(pb::Cancel { job_id: job_id.clone(), fencing_token: *fencing_token })
            }
            GatewayCommand::Ack { job_id, fencing_token } => {
                Body::Ack(pb::Ack { job_id: job_id.clone(), fencing_token: *fencing_token })
            }
            GatewayCommand::Lease { heartbeat_seq, lease } => {
                Body::Lease(pb::Lease { heartbeat_seq: *heartbeat_seq, lease_ms: duration_ms(*lease) })
            }
            GatewayCommand::Logs { request_id, job_id, fencing_token, from, max_bytes } => {
                Body::Logs(pb::LogsRequest {
                    request_id: *request_id,
                    job_id: job_id.clone(),
                    fencing_token: *fencing_token,
                    from: *from,
                    max_bytes: *max_bytes,
                })
            }
            GatewayCommand::Quote { request_id, job_id, spec } => Body::Quote(pb::QuoteRequest {
                request_id: *request_id,
                job_id: job_id.clone(),
                spec: Some(pb::JobSpec::from(spec)),
            }),
            GatewayCommand::Copy { copy_token, assignment } => {
                Body::Copy(pb::CopyOffer { copy_token: *copy_token, offer: Some(pb::Offer::from(assignment)) })
            }
            GatewayCommand::Grant { copy_token, assignment } => {
                Body::Grant(pb::CopyOffer { copy_token: *copy_token, offer: Some(pb::Offer::from(assignment)) })
            }
            GatewayCommand::DropCopy { job_id, copy_token } => {
                Body::DropCopy(pb::DropCopy { job_id: job_id.clone(), copy_token: *copy_token })
            }
        };
        pb::GatewayMessage { body: Some(body), epoch: 0 }
    }
}

impl TryFrom<pb::GatewayMessage> for GatewayCommand {
    type Error = ConvertError;
    fn try_from(message: pb::GatewayMessage) -> Result<Self> {
        use pb::gateway_message::Body;
        let Some(body) = message.body else { return Err(ConvertError::MissingField("body".into())) };
        Ok(match body {
            Body::Welcome(welcome) => GatewayCommand::Welcome {
                bound: welcome
                    .bound_jobs
                    .into_iter()
                    .enumerate()
                    .map(|(i, offer)| assignment_from_wire(offer, &format!("welcome.bound_jobs[{i}]")))
                    .collect::<Result<_>>()?,
                lease: (welcome.lease_ms > 0).then(|| Duration::from_millis(welcome.lease_ms)),
            },
            Body::Offer(offer) => GatewayCommand::Offer(assignment_from_wire(offer, "offer")?),
            Body::Cancel(cancel) => {
                GatewayCommand::Cancel { job_id: cancel.job_id, fencing_token: cancel.fencing_token }
            }
            Body::Ack(ack) => GatewayCommand::Ack { job_id: ack.job_id, fencing_token: ack.fencing_token },
            Body::Lease(lease) => GatewayCommand::Lease {
                heartbeat_seq: lease.heartbeat_seq,
                lease: Duration::from_millis(lease.lease_ms),
            },
            Body::Logs(request) => {
                if request.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("logs.job_id".into()));
                }
                GatewayCommand::Logs {
                    request_id: request.request_id,
                    job_id: request.job_id,
                    fencing_token: request.fencing_token,
                    from: request.from,
                    max_bytes: request.max_bytes,
                }
            }
            Body::Quote(request) => {
                if request.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("quote.job_id".into()));
                }
                let spec = request.spec.ok_or_else(|| ConvertError::MissingField("quote.spec".into()))?;
                GatewayCommand::Quote {
                    request_id: request.request_id,
                    job_id: request.job_id,
                    spec: JobSpec::try_from(spec)?,
                }
            }
            Body::Copy(copy) => {
                let offer = copy.offer.ok_or_else(|| ConvertError::MissingField("copy.offer".into()))?;
                GatewayCommand::Copy {
                    copy_token: copy.copy_token,
                    assignment: assignment_from_wire(offer, "copy.offer")?,
                }
            }
            Body::Grant(grant) => {
                let offer = grant.offer.ok_or_else(|| ConvertError::MissingField("grant.offer".into()))?;
                GatewayCommand::Grant {
                    copy_token: grant.copy_token,
                    assignment: assignment_from_wire(offer, "grant.offer")?,
                }
            }
            Body::DropCopy(drop) => {
                if drop.job_id.trim().is_empty() {
                    return Err(ConvertError::MissingField("drop_copy.job_id".into()));
                }
                GatewayCommand::DropCopy { job_id: drop.job_id, copy_token: drop.copy_token }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::job::JobState;

    fn report(state: JobState) -> JobReport {
        JobReport {
            job_id: "j-1".into(),
            fencing_token: 3,
            state,
            message: "done".into(),
            nodes: vec!["n-0".into()],
            requeue: false,
            preempted: false,
            usage: None,
        }
    }

    fn busy(gpu_utilization: f64) -> GpuUsage {
        GpuUsage { gpu_utilization, window: Duration::from_secs(60), samples: 12 }
    }

    #[test]
    fn every_agent_event_survives_the_wire() {
        let events = [
            AgentEvent::Status(report(JobState::Succeeded)),
            AgentEvent::Heartbeat {
                seq: 10,
                jobs: vec![JobReport { usage: Some(busy(0.03)), ..report(JobState::Running) }],
            },
            AgentEvent::Heartbeat { seq: 9, jobs: vec![report(JobState::Running), report(JobState::Failed)] },
            AgentEvent::OfferReply {
                job_id: "j-2".into(),
                fencing_token: 1,
                accepted: false,
                reason: "full".into(),
                permanent: true,
            },
            AgentEvent::Logs {
                request_id: 7,
                result: Ok(LogChunk { data: "hello\n".into(), offset: 4, next_offset: 10, complete: true }),
            },
            AgentEvent::Logs { request_id: 8, result: Err("no such job".into()) },
            AgentEvent::Quote {
                request_id: 9,
                result: Ok(StartQuote {
                    starts: vec![
                        TypeStart { gpu_type: "A100".into(), after_secs: 0, preempts: false },
                        TypeStart { gpu_type: "V100".into(), after_secs: 5400, preempts: true },
                    ],
                    basis: "EASY plan".into(),
                }),
            },
            AgentEvent::Quote { request_id: 10, result: Ok(StartQuote::default()) },
            AgentEvent::Quote { request_id: 11, result: Err("sbatch --test-only failed".into()) },
            AgentEvent::CopyReady { job_id: "j-2".into(), copy_token: 12 },
            AgentEvent::CopyDropped {
                job_id: "j-2".into(),
                copy_token: 13,
                reason: "this backend has no start gate".into(),
                unsupported: true,
            },
        ];
        for event in events {
            let back = Option::<AgentEvent>::try_from(pb::AgentMessage::from(&event)).unwrap();
            assert_eq!(back, Some(event));
        }
    }

    #[test]
    fn a_report_without_usage_reads_as_unknown_and_a_bad_utilisation_names_its_field() {
        let mut wire = pb::JobStatus::from(&report(JobState::Running));
        assert_eq!(wire.usage, None);
        assert_eq!(JobReport::try_from(wire.clone()).unwrap().usage, None);
        wire.usage = Some(pb::JobUsage { gpu_utilization: 0.5, window_seconds: 60, samples: 0 });
        assert_eq!(JobReport::try_from(wire.clone()).unwrap().usage, None, "no samples means unknown");
        for bad in [1.5, -0.1, f64::NAN] {
            wire.usage = Some(pb::JobUsage { gpu_utilization: bad, window_seconds: 60, samples: 3 });
            let err = JobReport::try_from(wire.clone()).unwrap_err().to_string();
            assert!(err.contains("status.usage.gpu_utilization"), "{err}");
        }
    }

    #[test]
    fn a_heartbeat_with_a_bad_state_names_the_job_entry() {
        let mut wire = pb::Heartbeat { seq: 1, jobs: vec![pb::JobStatus::from(&report(JobState::Running))] };
        wire.jobs[0].state = 99;
        let message = pb::AgentMessage { body: Some(pb::agent_message::Body::Heartbeat(wire)) };
        let err = Option::<AgentEvent>::try_from(message).unwrap_err();
        assert!(err.to_string().contains("heartbeat.jobs[0].state"), "{err}");
    }

    #[test]
    fn copy_commands_round_trip_and_a_copy_without_its_job_names_the_field() {
        let assignment = Assignment {
            job_id: "j-4".into(),
            fencing_token: 2,
            spec: crate::testing::spec(crate::testing::JOB),
            last_preempted_at_ms: Some(1_700_000_000_000),
        };
        let commands = [
            GatewayCommand::Copy { copy_token: 7, assignment: assignment.clone() },
            GatewayCommand::Grant { copy_token: 7, assignment: Assignment { fencing_token: 3, ..assignment } },
            GatewayCommand::DropCopy { job_id: "j-4".into(), copy_token: 8 },
        ];
        for command in commands {
            assert_eq!(GatewayCommand::try_from(pb::GatewayMessage::from(&command)).unwrap(), command);
        }
        let message = pb::GatewayMessage {
            body: Some(pb::gateway_message::Body::Grant(pb::CopyOffer { copy_token: 1, offer: None })),
            epoch: 0,
        };
        let err = GatewayCommand::try_from(message).unwrap_err();
        assert!(err.to_string().contains("grant.offer"), "{err}");
        let message = pb::AgentMessage {
            body: Some(pb::agent_message::Body::CopyReady(pb::CopyReady { job_id: " ".into(), copy_token: 1 })),
        };
        let err = Option::<AgentEvent>::try_from(message).unwrap_err();
        assert!(err.to_string().contains("copy_ready.job_id"), "{err}");
    }

    #[test]
    fn a_quote_request_round_trips_and_a_start_without_a_type_names_its_entry() {
        let spec = crate::testing::spec(crate::testing::JOB);
        let command = GatewayCommand::Quote { request_id: 3, job_id: "j-3".into(), spec };
        assert_eq!(GatewayCommand::try_from(pb::GatewayMessage::from(&command)).unwrap(), command);
        let reply = pb::QuoteReply {
            request_id: 1,
            result: Some(pb::quote_reply::Result::Quote(pb::StartQuote {
                starts: vec![
                    pb::TypeStart { gpu_type: "A100".into(), after_seconds: 1, preempts: false },
                    pb::TypeStart { gpu_type: " ".into(), after_seconds: 2, preempts: false },
                ],
                basis: String::new(),
            })),
        };
        let message = pb::AgentMessage { body: Some(pb::agent_message::Body::Quote(reply)) };
        let err = Option::<AgentEvent>::try_from(message).unwrap_err();
        assert!(err.to_string().contains("quote.starts[1].gpu_type"), "{err}");
    }

    #[test]
    fn a_hello_without_an_instance_id_is_refused() {
        let info = ClusterInfo { prices: BTreeMap::new(), ..crate::testing::cluster_info("east") };
        let hello = AgentHello { info, instance_id: "abc".into(), agent_version: "0.1.0".into() };
        assert_eq!(AgentHello::try_from(pb::Hello::from(&hello)).unwrap(), hello);
        let mut wire = pb::Hello::from(&hello);
        wire.instance_id.clear();
        assert!(AgentHello::try_from(wire).unwrap_err().to_string().contains("hello.instance_id"));
    }

    #[test]
    fn gateway_commands_survive_the_wire() {
        let commands = [
            GatewayCommand::Ack { job_id: "j".into(), fencing_token: 2 },
            GatewayCommand::Lease { heartbeat_seq: 4, lease: Duration::from_secs(90) },
            GatewayCommand::Cancel { job_id: "j".into(), fencing_token: 2 },
            GatewayCommand::Logs {
                request_id: 7,
                job_id: "j".into(),
                fencing_token: 2,
                from: Some(10),
                max_bytes: 4096,
            },
            GatewayCommand::Logs { request_id: 8, job_id: "j".into(), fencing_token: 2, from: None, max_bytes: 100 },
            GatewayCommand::Welcome { bound: Vec::new(), lease: Some(Duration::from_secs(540)) },
        ];
        for command in commands {
            assert_eq!(GatewayCommand::try_from(pb::GatewayMessage::from(&command)).unwrap(), command);
        }
    }

    #[test]
    fn preemption_travels_in_offers_and_reports() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "n", "tenant": "t", "preemptible": true,
            "gang": {"resources": {"gpus": 1}}, "payload": {"command": ["true"]}
        }))
        .unwrap();
        let offer = GatewayCommand::Offer(Assignment {
            job_id: "j".into(),
            fencing_token: 3,
            spec,
            last_preempted_at_ms: Some(1_700_000_000_000),
        });
        assert_eq!(GatewayCommand::try_from(pb::GatewayMessage::from(&offer)).unwrap(), offer);
        let stopped = JobReport { requeue: true, preempted: true, ..report(JobState::Failed) };
        let event = AgentEvent::Status(stopped);
        assert_eq!(Option::<AgentEvent>::try_from(pb::AgentMessage::from(&event)).unwrap(), Some(event));
    }
}
