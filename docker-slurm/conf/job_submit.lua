-- job_submit.lua: placeholder that logs each submission and lets everything through.
-- Only a fallback: slurmgpu.labcluster.render installs ../../plugins/job_submit.lua (the
-- slurmgpu plugin) instead whenever it exists next to these templates.
-- Loaded by JobSubmitPlugins=lua from slurm.conf's directory.
function slurm_job_submit(job_desc, part_list, submit_uid)
   slurm.log_info("job_submit.lua: name=%s uid=%s", tostring(job_desc.name), tostring(submit_uid))
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
