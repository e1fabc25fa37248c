#!/usr/bin/env bash
# Make sure Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432) answer; start them if not.
set -uo pipefail
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null; }
pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null || (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }

if ! redis_up; then
  echo "starting redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! pg_up; then
  echo "starting postgresql"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
for _ in $(seq 1 30); do
  if redis_up && pg_up; then exit 0; fi
  sleep 1
done
redis_up || echo "warning: redis is not answering on 127.0.0.1:6379" >&2
pg_up || echo "warning: postgresql is not answering on 127.0.0.1:5432" >&2
exit 0
