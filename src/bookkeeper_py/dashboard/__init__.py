"""``bookkeeper dashboard``: a web page of the cluster, served by an aiohttp app over the admin
service layer (``admin.service.ClusterAdmin``) and the bookies' HTTP endpoints.

* ``metrics``: successive scrapes of a bookie's ``/metrics`` turned into rates and p99 latency
  (no I/O; times are arguments), and the ring buffers of the last minutes;
* ``collector``: the poller that asks the metadata store and every bookie, once a second;
* ``app``: the JSON API the page polls, the actions (refused unless enabled), the optional
  shared-secret authentication, and the page itself (``static/``: one HTML page, a JavaScript
  file that draws the charts as inline SVG, a CSS file; nothing from the network);
* ``command``: the ``bookkeeper dashboard`` command, and a dashboard on a thread of its own for
  ``localbookie``.
"""
