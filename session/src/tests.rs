//! The session's rules that need no scheduler: what a failed call means,
//! which plan the loop switches to, which reports are sent. The protocol
//! itself runs against a scripted scheduler in
//! `tests/python/test_session_conformance.py` (through the worker binary
//! and the Python binding alike).

use super::*;
use crate::connection::{failed_for_tests, report_request};
use crate::failure::{Call, Failure, classify};
use tonic::Code;

#[test]
fn failures_mean_what_the_protocol_says() {
    for c in [
        Code::InvalidArgument,
        Code::ResourceExhausted,
        Code::Unimplemented,
    ] {
        assert_eq!(classify(Call::Register, c), Failure::Fatal, "{c:?}");
    }
    for c in [Code::Unavailable, Code::DeadlineExceeded, Code::Internal] {
        assert_eq!(classify(Call::Register, c), Failure::Lost, "{c:?}");
        assert_eq!(classify(Call::Report, c), Failure::Lost, "{c:?}");
    }
    for c in [Code::NotFound, Code::PermissionDenied] {
        assert_eq!(classify(Call::Report, c), Failure::Gone, "{c:?}");
        assert_eq!(classify(Call::Other, c), Failure::Gone, "{c:?}");
    }
    for c in [Code::FailedPrecondition, Code::InvalidArgument] {
        assert_eq!(classify(Call::Report, c), Failure::Skip, "{c:?}");
    }
    let (why, gone) = failed_for_tests(
        Call::Report,
        "ReportLatencies",
        7,
        &tonic::Status::not_found("no job 7"),
    );
    assert!(gone);
    assert_eq!(
        why,
        "job 7 is no longer registered (ReportLatencies: NOT_FOUND: no job 7)"
    );
    assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
}

fn plan(registration: u64, version: u64) -> PushedPlan {
    PushedPlan {
        job_id: 1,
        registration,
        version,
        plan: Plan::default(),
        diagnostics: Vec::new(),
    }
}

/// A session with no background thread, whose reports land in the
/// returned receiver.
fn offline(ops: usize) -> (Session, mpsc::UnboundedReceiver<Report>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let session = Session {
        inner: Arc::new(Inner::default()),
        reports: Mutex::new(Some(tx)),
        thread: Mutex::new(None),
        ops,
        log: LogSink::new(|_, _| {}),
    };
    (session, rx)
}

fn report(ops: usize) -> Report {
    Report {
        op_latency_s: vec![1e-3; ops],
        ..Report::default()
    }
}

#[test]
fn a_restarted_schedulers_first_plan_is_new_though_its_job_id_and_version_are_not() {
    let (session, _rx) = offline(3);
    session.applied(&plan(1, 1));
    // The same registration's plan again: nothing new.
    session.inner.update(|s| s.newest = Some(plan(1, 1)));
    assert!(session.iteration_done(report(3)).is_none());
    // The scheduler restarted: job 1 again, version 1 again, but a new
    // registration of this session. The loop must switch to it.
    session.inner.update(|s| s.newest = Some(plan(2, 1)));
    let got = session
        .iteration_done(report(3))
        .expect("the new registration's plan");
    assert_eq!(got.key(), (2, 1));
    assert!(session.iteration_done(report(3)).is_none());
    // Taken without a report, as at a first step that waits for its plan.
    session.inner.update(|s| s.newest = Some(plan(2, 2)));
    assert_eq!(session.take_plan().map(|p| p.key()), Some((2, 2)));
    assert!(session.take_plan().is_none());
}

#[test]
fn only_a_report_with_a_latency_per_op_is_sent() {
    let (session, mut rx) = offline(3);
    assert!(session.iteration_done(report(2)).is_none());
    assert!(
        rx.try_recv().is_err(),
        "a report of 2 latencies for 3 ops went out"
    );
    session.iteration_done(report(3));
    assert_eq!(rx.try_recv().expect("sent").op_latency_s.len(), 3);
    // Once finished, reports go nowhere and the channel is closed.
    assert!(session.finish(Duration::from_millis(10)));
    session.iteration_done(report(3));
    assert!(matches!(
        rx.try_recv(),
        Err(mpsc::error::TryRecvError::Disconnected)
    ));
}

#[test]
fn waiting_for_a_new_plan_skips_the_one_applied_or_the_one_named() {
    let (session, _rx) = offline(1);
    let short = Duration::from_millis(20);
    assert!(session.wait_for_new_plan(short, None).is_none());
    session.inner.update(|s| s.newest = Some(plan(1, 1)));
    // Nothing applied yet: the newest is new.
    assert_eq!(
        session.wait_for_new_plan(short, None).map(|p| p.key()),
        Some((1, 1))
    );
    session.applied(&plan(1, 1));
    assert!(session.wait_for_new_plan(short, None).is_none());
    // (0, 0) names no plan: any plan will do.
    assert!(session.wait_for_new_plan(short, Some((0, 0))).is_some());
    // A plan arriving while it waits wakes it.
    let inner = session.inner.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        inner.update(|s| s.newest = Some(plan(1, 2)));
    });
    let got = session.wait_for_new_plan(Duration::from_secs(10), None);
    pusher.join().expect("the pusher");
    assert_eq!(got.map(|p| p.key()), Some((1, 2)));
}

#[test]
fn a_state_has_its_contract_name() {
    let mut s = Status::default();
    assert_eq!(s.state_name(), "JOB_STATE_UNSPECIFIED");
    s.state = pb::JobState::Queued as i32;
    assert_eq!(s.state_name(), "JOB_STATE_QUEUED");
    s.state = 99;
    assert_eq!(s.state_name(), "JOB_STATE_UNSPECIFIED");
}

#[test]
fn the_measured_base_goes_out_with_the_report_and_zero_means_not_measured() {
    let (session, mut rx) = offline(2);
    let job = pb::RegisterJobResponse {
        job_id: 4,
        token: "t".into(),
        ..Default::default()
    };
    // The loop's report reaches the connection whole, base included, and
    // goes on the wire as it came.
    session.iteration_done(Report {
        iteration: 3,
        peak_bytes: 7_000_000,
        base_bytes: 912_000_000,
        ..report(2)
    });
    let sent = rx.try_recv().expect("sent");
    let wire = report_request(&job, 2, sent);
    assert_eq!((wire.job_id, wire.plan_version, wire.iteration), (4, 2, 3));
    assert_eq!((wire.peak_bytes, wire.base_bytes), (7_000_000, 912_000_000));
    // A report that measured no base says 0: the scheduler keeps the base
    // it plans with.
    session.iteration_done(report(2));
    let wire = report_request(&job, 2, rx.try_recv().expect("sent"));
    assert_eq!(wire.base_bytes, 0);
}
