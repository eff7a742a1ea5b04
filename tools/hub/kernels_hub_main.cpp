// libreyolo-kernels-hub: pins, prefetches and verifies hub kernels (docs/HUB_KERNELS.md).
//
//   libreyolo-kernels-hub lock     [common] [--slot S] [--repo ORG/NAME] [--revision REV |
//   --version N]
//                                  [--variant NAME]... [--format libreyolo|upstream]
//   libreyolo-kernels-hub download [common] [--variant NAME]... [--all-variants]
//   libreyolo-kernels-hub verify   [common] [--variant NAME]... [--all-variants]
//   common: [--config FILE] [--lock-file FILE]
// lock resolves REV (default v1 of kernels-community/deformable-detr), or the v<N> branch from the
// Hub's refs list for --version N, to a commit and writes the SHA-256 of every file of every
// variant into kernels.lock (next to --config, or --lock-file); --format upstream writes
// huggingface/kernels' format instead (one git_lfs_concat hash per variant, no download).
// lock --update locks every entry of the lock file again at the version or revision it asks for
// (an entry {"repo_id": ..., "version": 1} without a sha is pinned to the v1 branch's commit).
// download fetches the locked files of the variants this process can load (or all) into the
// cache; verify checks the cache against kernels.lock without any request.
// Settings (endpoint, cache, offline, timeout) come from --config's `kernels.hub` and the
// environment (HF_ENDPOINT, HF_TOKEN, KERNELS_CACHE, HF_HUB_CACHE, HF_HUB_OFFLINE).
// Exit codes: 0 ok, 1 failure, 2 usage error.
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/hub/fetch.h"
#include "kernels/hub/lock.h"
#include "kernels/hub/provider.h"
#include "kernels/policy.h"
#include "log/log.h"

namespace {

namespace hub = libreyolo::kernels::hub;
using libreyolo::kernels::HubSettings;

/// Prints the usage: to stdout and returns 0 for --help (`help` true), else to stderr after
/// `error` and returns 2.
int usage(const std::string& error, bool help = false) {
  if (!error.empty()) std::cerr << "error: " << error << "\n";
  (help ? std::cout : std::cerr)
      << "usage: libreyolo-kernels-hub lock|download|verify [--config FILE] [--lock-file FILE]\n"
         "         lock:     [--slot ms_deform_attn] [--repo ORG/NAME] [--revision REV | "
         "--version N] [--variant NAME]...\n"
         "                   [--format libreyolo|upstream]\n"
         "                   --update [--format libreyolo|upstream]   (every entry of the lock "
         "again)\n"
         "         download: [--variant NAME]... [--all-variants]\n"
         "         verify:   [--variant NAME]... [--all-variants]\n";
  return help ? 0 : 2;
}

struct Args {
  std::string command, config, lock_file,
      slot = "ms_deform_attn", repo = "kernels-community/deformable-detr", revision = "v1";
  std::vector<std::string> variants;
  bool all_variants = false;
  bool update = false;  ///< lock: every entry of the lock file again, by its version or revision
  std::optional<int> version;
  hub::LockFormat format = hub::LockFormat::libreyolo;
};

// Variants of `entry` to fetch or check: explicit ones, all, or those this process can load.
std::vector<std::string> chosen(const hub::LockEntry& entry, const Args& a) {
  if (!a.variants.empty()) return a.variants;
  std::vector<std::string> names;
  for (const auto& [name, v] : entry.variants) names.push_back(name);
  if (a.all_variants) return names;
  const auto system = hub::detect_system();
  auto selection = hub::select_variants(names, system);
  for (const auto& [name, why] : selection.rejected) {
    std::cout << "  skip " << name << ": " << why << "\n";
  }
  return selection.accepted;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("");
  if (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") return usage("", true);
  Args a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--config")
        a.config = value();
      else if (k == "--lock-file")
        a.lock_file = value();
      else if (k == "--slot")
        a.slot = value();
      else if (k == "--repo")
        a.repo = value();
      else if (k == "--revision")
        a.revision = value();
      else if (k == "--version") {
        const std::string v = value();
        if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos)
          return usage("--version needs a major version number, got '" + v + "'");
        a.version = std::stoi(v);
      } else if (k == "--format") {
        const std::string f = value();
        const auto format = hub::parse_lock_format(f);
        if (!format) return usage("--format is libreyolo or upstream, got '" + f + "'");
        a.format = *format;
      } else if (k == "--variant")
        a.variants.push_back(value());
      else if (k == "--all-variants")
        a.all_variants = true;
      else if (k == "--update")
        a.update = true;
      else
        return usage("unknown argument " + k);
    } catch (const std::invalid_argument& e) {
      return usage(e.what());
    }
  }
  if (a.command != "lock" && a.command != "download" && a.command != "verify") {
    return usage("unknown command " + a.command);
  }
  try {
    const auto env = libreyolo::kernels::process_environment();
    HubSettings settings = a.config.empty()
                               ? libreyolo::kernels::policy_from_environment(env).hub
                               : libreyolo::kernels::load_policy_file(a.config, env).hub;
    std::string lock_path = a.lock_file.empty() ? hub::lock_file_path(settings) : a.lock_file;
    if (lock_path.empty()) lock_path = "kernels.lock";
    if (a.command == "verify") settings.offline.value = true;
    const hub::Connection connection = hub::connection_for(settings);

    if (a.command == "lock") {
      std::vector<hub::LockEntry> entries;
      if (FILE* f = std::fopen(lock_path.c_str(), "r")) {
        std::fclose(f);
        entries = hub::read_lock_file(lock_path);
      }
      if (a.update) {
        // Each entry again at what it asks for: `version` N (the vN branch now) or `revision`;
        // an entry asking for neither (upstream's format records only the commit) is an error.
        for (auto& e : entries) {
          if (!e.version && e.revision.empty()) {
            throw std::runtime_error(e.repo_id + " in " + lock_path +
                                     " asks for no version or revision: lock it with --repo " +
                                     e.repo_id + " --version N");
          }
          std::vector<std::string> variants;
          for (const auto& [name, v] : e.variants) variants.push_back(name);
          e = hub::lock_repo(connection, e.slot, e.repo_id, e.revision, variants, a.format,
                             e.version);
          std::cout << "locked " << e.repo_id << " " << e.revision << " -> " << e.sha << " ("
                    << e.variants.size() << " variants, " << hub::lock_format_name(a.format)
                    << " format)\n";
        }
        hub::write_lock_file(lock_path, entries, a.format);
        std::cout << "updated " << entries.size() << " entries in " << lock_path << "\n";
        return 0;
      }
      const auto entry =
          hub::lock_repo(connection, a.slot, a.repo, a.revision, a.variants, a.format, a.version);
      hub::upsert(entries, entry);
      hub::write_lock_file(lock_path, entries, a.format);
      std::cout << "locked " << entry.repo_id << " " << entry.revision << " -> " << entry.sha
                << " (" << entry.variants.size() << " variants, " << hub::lock_format_name(a.format)
                << " format) in " << lock_path << "\n";
      return 0;
    }
    const auto entries = hub::read_lock_file(lock_path);
    int failures = 0;
    for (const auto& entry : entries) {
      try {
        for (const auto& dir : hub::download_locked(connection, entry, chosen(entry, a))) {
          std::cout << (a.command == "verify" ? "verified " : "cached ") << dir << "\n";
        }
      } catch (const std::exception& e) {
        std::cerr << entry.repo_id << ": " << e.what() << "\n";
        ++failures;
      }
    }
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
