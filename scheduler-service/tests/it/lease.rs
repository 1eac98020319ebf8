//! Leases, in paused tokio time: a job whose subscriber vanished is removed
//! once its lease lapses, and the others are re-planned; so is a hung one
//! (its plan stream open, but no reports or heartbeats): an open stream
//! does not hold the lease.

use std::time::Duration;

use tensile_proto::pb;

use crate::util::*;

#[tokio::test(start_paused = true)]
async fn a_vanished_subscriber_lapses_and_the_others_are_replanned() {
    let s = unix(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = register(&mut c, "stays", &g).await;
    let b = register(&mut c, "vanishes", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    let v = next_plan(&mut pa).await.version;
    {
        let mut other = connect(&s.address).await;
        let mut pb_ = subscribe(&mut other, &b).await;
        next_plan(&mut pb_).await;
        // The worker goes: its connection and stream with it.
    }
    let beat = |c: &mut Client| {
        let mut c = c.clone();
        let (id, token) = (a.job_id, a.token.clone());
        async move {
            c.heartbeat(pb::HeartbeatRequest { job_id: id, token })
                .await
                .unwrap();
        }
    };
    // Within the lease nothing happens...
    tokio::time::sleep(Duration::from_secs(5)).await;
    beat(&mut c).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.jobs.len(), 2);
    // ...past it, b is gone and a is re-planned alone; a's heartbeats kept
    // its lease.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        beat(&mut c).await;
    }
    let st = c
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<u64> = st.jobs.iter().map(|j| j.job_id).collect();
    assert_eq!(ids, vec![a.job_id]);
    let mut last = v;
    while last == v {
        last = next_plan(&mut pa).await.version;
    }
    assert!(last > v);
    let e = c
        .heartbeat(pb::HeartbeatRequest {
            job_id: b.job_id,
            token: b.token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_job_without_a_stream() {
    let s = tcp(config()).await;
    let mut c = connect(&s.address).await;
    let r = register(&mut c, "beats", &mlp(64)).await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        c.heartbeat(pb::HeartbeatRequest {
            job_id: r.job_id,
            token: r.token.clone(),
        })
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(st.jobs.is_empty());
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_subscriber_lapses_though_its_stream_is_open() {
    let s = unix(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = register(&mut c, "hangs", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    next_plan(&mut pa).await;
    // The worker hangs: its stream stays open, nothing else comes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.jobs.len(), 1, "removed within its lease");
    tokio::time::sleep(Duration::from_secs(11)).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(st.jobs.is_empty(), "still there past its lease: {st:?}");
    // Its stream says why and ends.
    let mut last = None;
    while let Some(u) = pa.message().await.unwrap() {
        last = Some(u.state);
    }
    assert_eq!(last, Some(pb::JobState::Done as i32));
    s.stop().await;
}
