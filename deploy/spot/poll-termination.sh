#!/bin/sh
# Watches the cloud's spot/preemption notice and tells the local kolo agent
# to leave: SIGTERM makes it drain its host (elastic jobs leave at their next
# commit, no step lost) and exit once its workers are gone (docs/deploy.md).
# Run it next to the agent on each spot instance, e.g. as a systemd service:
#   ExecStart=/usr/share/kolo/poll-termination.sh aws
# (An example: it was not run here, where no cloud metadata service exists.)
set -eu
cloud="${1:-aws}"
notice() {
    case "$cloud" in
    aws) # 200 with an action once the two-minute notice is given (IMDSv2)
        t=$(curl -sf -m 2 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" \
            http://169.254.169.254/latest/api/token) || return 1
        curl -sf -m 2 -H "X-aws-ec2-metadata-token: $t" \
            http://169.254.169.254/latest/meta-data/spot/instance-action >/dev/null ;;
    gcp) # "TRUE" once the instance is being preempted
        [ "$(curl -sf -m 2 -H 'Metadata-Flavor: Google' \
            http://metadata.google.internal/computeMetadata/v1/instance/preempted)" = TRUE ] ;;
    azure) # a Preempt event in the scheduled events
        curl -sf -m 2 -H Metadata:true \
            'http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01' |
            grep -q '"EventType": *"Preempt"' ;;
    *) echo "usage: $0 aws|gcp|azure" >&2; exit 2 ;;
    esac
}
while ! notice; do
    sleep 5
done
echo "kolo: termination notice from $cloud: draining this host" >&2
systemctl kill --signal=SIGTERM kolo-agent.service 2>/dev/null || pkill -TERM -x -f '.*kolo agent.*'
