// comm-store: a standalone TCPStore server, for jobs whose store should not
// live inside rank 0 (so that rank 0 may restart, say).
//
//   comm-store [--host HOST] [--port PORT]
//
// It prints "comm-store listening on HOST:PORT" once it accepts connections
// (with the port it picked when PORT is 0), and stops cleanly on SIGINT or
// SIGTERM. With COMM_STORE_TOKEN set, it admits only clients that prove
// they hold the same token (challenge-response; the token is never sent),
// and every rank must set it too.
#include <signal.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "store/tcp_store_server.h"

int main(int argc, char** argv) {
  CLI::App app{"comm-store: a standalone libcomm TCPStore server"};
  comm::TCPStoreServerOptions options;
  options.port = 29500;
  app.add_option("--host", options.host,
                 "address to listen on (0.0.0.0 or :: for every interface)")
      ->capture_default_str();
  app.add_option("--port", options.port,
                 "port to listen on; 0 picks a free one")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; bad arguments exit 2, as usage errors do elsewhere.
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Block the signals before the server's thread starts, so that it inherits
  // the mask and sigwait below is the only place they arrive.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    comm::TCPStoreServer server(options);
    std::printf("comm-store listening on %s\n",
                comm::detail::host_port(server.host(), server.port()).c_str());
    std::fflush(stdout);
    int received = 0;
    sigwait(&stop_signals, &received);
    std::fprintf(stderr, "comm-store: %s received, stopping\n",
                 received == SIGINT ? "SIGINT" : "SIGTERM");
    if (!server.stop()) return 1;
  } catch (const comm::Error& e) {
    std::fprintf(stderr, "comm-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
